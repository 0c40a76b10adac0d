"""Random symmetries of maze examples for training: the square's 8 rotations and reflections, edges reshuffled.

Rotating or reflecting the grid maps a maze (a spanning tree of the grid) to a maze and its start->goal path to
the new maze's path, cell by cell; the edges' order and orientation carry no information, so they are drawn
afresh too. DFS mazes grown from a random cell are as likely in every orientation, so augmented examples
follow the distribution the split was drawn from.
"""

from __future__ import annotations

import torch


def grid_symmetries(n: int) -> torch.Tensor:
    """[8, n*n]: where each cell (id row * n + col) goes under each symmetry of the n x n square."""
    row, col = torch.arange(n * n) // n, torch.arange(n * n) % n
    last = n - 1
    images = [(row, col), (col, last - row), (last - row, last - col), (last - col, row),  # rotations
              (col, row), (last - col, last - row), (row, last - col), (last - row, col)]  # reflections
    return torch.stack([r * n + c for r, c in images])


def random_maze_symmetries(tokens: torch.Tensor, n: int, answer_start: int, cells_answer: bool,
                           generator: torch.Generator) -> torch.Tensor:
    """One uniformly drawn symmetry per row of `tokens` (maze sequences, mazes.py's layout: edges, [SEP], start,
    goal, [SEP], answer), with the edges in a fresh random order and orientation. Cell tokens are ids < n*n;
    a `cells_answer` region holds one token per cell, which moves with its cell."""
    batch, cells = tokens.shape[0], n * n
    where = grid_symmetries(n)[torch.randint(8, (batch,), generator=generator)]  # [B, cells]
    order = torch.rand(batch, cells - 1, generator=generator).argsort(dim=1)
    flip = (torch.rand(batch, cells - 1, 1, generator=generator) < 0.5).long()
    edges = tokens[:, : 2 * (cells - 1)].view(batch, cells - 1, 2)
    edges = edges.gather(1, order.unsqueeze(2).expand(-1, -1, 2))
    edges = edges.gather(2, torch.cat([flip, 1 - flip], dim=2))

    out = torch.cat([edges.reshape(batch, -1), tokens[:, 2 * (cells - 1):]], dim=1)
    out = torch.where(out < cells, where.gather(1, out.clamp(max=cells - 1)), out)  # relabel every cell token
    if cells_answer:  # the token of cell i goes to position where[i]
        answer = torch.empty_like(tokens[:, answer_start:])
        answer.scatter_(1, where, tokens[:, answer_start:])
        out[:, answer_start:] = answer
    return out

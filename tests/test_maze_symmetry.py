"""Training-time maze symmetries (data.augment=true): every augmented example is a maze with its own answer."""

from __future__ import annotations

import pytest
import torch

from mdmkit.tasks.maze import MazeTask
from mdmkit.tasks.maze_generator import maze_path
from mdmkit.tasks.maze_symmetry import grid_symmetries


def _decode(task: MazeTask, row: torch.Tensor) -> tuple[list[tuple[int, int]], int, int, list[int]]:
    """Edges, start, goal and the answer's path cells (in order for `path`, sorted for `cells`) of one sequence."""
    n_edges = task.n_cells - 1
    edges = [tuple(pair) for pair in row[: 2 * n_edges].view(-1, 2).tolist()]
    start, goal = row[2 * n_edges + 1].item(), row[2 * n_edges + 2].item()
    answer = row[task.answer_start:]
    if task.answer == "path":
        path = [cell for cell in answer.tolist() if cell < task.n_cells]
    else:
        path = (answer == task.vocab.index("[ON]")).nonzero().view(-1).tolist()
    return edges, start, goal, path


@pytest.mark.parametrize("answer", ["path", "cells"])
def test_each_augmented_maze_is_a_maze_whose_answer_is_its_path(answer: str) -> None:
    task = MazeTask(grid_size=5, answer=answer, n_train=1, n_val=1, n_test=1)
    made = task.generate(16, seed=4)
    tokens, mask = torch.from_numpy(made.tokens), torch.from_numpy(made.answer_mask)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        moved, moved_mask = task.augment(tokens, mask, generator)
        assert torch.equal(moved_mask, mask)
        for before, after in zip(tokens, moved):
            edges, start, goal, path = _decode(task, after)
            truth = maze_path(task.grid_size, edges, start, goal)  # raises unless the edges are a spanning tree
            assert path == (truth if answer == "path" else sorted(truth))
            assert len(path) == len(_decode(task, before)[3])  # the same problem, moved
        assert not torch.equal(moved, tokens)


def test_the_eight_symmetries_are_distinct_grid_isometries() -> None:
    n = 4
    maps = grid_symmetries(n)
    assert len({tuple(m.tolist()) for m in maps}) == 8
    for image in maps:
        assert sorted(image.tolist()) == list(range(n * n))
        for cell in range(n * n):  # neighbours stay neighbours
            for other in (cell + 1, cell + n):
                if other < n * n and (other == cell + n or other % n):
                    a, b = divmod(image[cell].item(), n), divmod(image[other].item(), n)
                    assert abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1


def test_every_symmetry_is_drawn_about_equally_often() -> None:
    """Where the start cell 0 lands: the 4 corners, each with probability 1/4 (two symmetries per corner)."""
    task = MazeTask(grid_size=3, n_train=1, n_val=1, n_test=1)
    made = task.generate(1, seed=0)
    draws = 8000
    tokens = torch.from_numpy(made.tokens).repeat(draws, 1)
    tokens[:, 2 * (task.n_cells - 1) + 1] = 0  # start at the top-left corner
    moved, _ = task.augment(tokens, torch.from_numpy(made.answer_mask).repeat(draws, 1),
                            torch.Generator().manual_seed(1))
    corners = moved[:, 2 * (task.n_cells - 1) + 1].bincount(minlength=task.n_cells)
    assert set(corners.nonzero().view(-1).tolist()) == {0, 2, 6, 8}
    sigma = (draws * 0.25 * 0.75) ** 0.5
    assert all(abs(corners[c].item() - draws / 4) < 5 * sigma for c in (0, 2, 6, 8))

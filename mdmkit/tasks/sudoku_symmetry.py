"""Random validity-preserving symmetries of Sudoku examples, drawn afresh for every training batch.

A solved grid stays solved, and a puzzle keeps its unique solution and its difficulty, under relabelling the
digits, permuting the three bands (and the rows inside each band), the three stacks (and the columns inside
each), and transposing. That group has 9! * (3!^4)^2 * 2 (about 1.2e12) elements, so the model meets each
stored puzzle in a new surface form at nearly every presentation, which leaves it little to memorize.
"""

from __future__ import annotations

import torch


def _line_orders(batch: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, 9]: a uniform random order of the nine rows (or columns) that keeps each band (stack) together."""
    bands = torch.rand(batch, 3, generator=generator).argsort(dim=1)
    within = torch.rand(batch, 3, 3, generator=generator).argsort(dim=2)
    return (bands.unsqueeze(2) * 3 + within).reshape(batch, 9)


def random_symmetries(cells: torch.Tensor, answer_mask: torch.Tensor,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply one uniformly drawn symmetry per row to `cells` ([B, 81] digit ids 0..8 of solved grids, row-major)
    and move `answer_mask` ([B, 81]) with its cells."""
    batch = cells.shape[0]
    rows, cols = _line_orders(batch, generator), _line_orders(batch, generator)
    transpose = torch.rand(batch, generator=generator) < 0.5
    relabel = torch.rand(batch, 9, generator=generator).argsort(dim=1)  # digit d becomes relabel[d]

    # the cell each new position (r, c) reads: (rows[r], cols[c]), or (rows[c], cols[r]) when transposed
    source = rows.unsqueeze(2) * 9 + cols.unsqueeze(1)
    source = torch.where(transpose.view(-1, 1, 1), source.transpose(1, 2), source).reshape(batch, 81)
    return relabel.gather(1, cells.gather(1, source)), answer_mask.gather(1, source)

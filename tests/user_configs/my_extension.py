"""A user's own sampler and task, kept outside mdmkit (README: "Your own sampler or task").

mdmkit finds them through their config groups in my_conf/, added with `hydra.searchpath=[file://my_conf]`;
this directory must be importable (run from it, or put it on PYTHONPATH).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers import MaskedSampler
from mdmkit.samplers.budget import Ranked
from mdmkit.tasks.sudoku import SudokuTask


@dataclass(frozen=True)
class RevealFraction:
    """A budget rule: reveal this fraction of the eligible positions per step (the loop reveals at least one)."""

    fraction: float

    def __post_init__(self) -> None:
        require(0.0 < self.fraction <= 1.0, f"fraction={self.fraction} must lie in (0, 1]")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return (ranked.n_eligible * self.fraction).long()


@dataclass
class FractionSampler(MaskedSampler):
    """mdmkit's masked loop (ordering, choice, blocks) with the RevealFraction budget."""

    budget_rule = RevealFraction
    fraction: float = 0.5


@dataclass
class EasySudoku(SudokuTask):
    """Sudoku with more givens, under its own name (its own data cache and results rows)."""

    name = "easy_sudoku"

    n_givens: int | tuple[int, int] = 60

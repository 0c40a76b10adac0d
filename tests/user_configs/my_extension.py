"""A user's own sampler, task and training objective, kept outside mdmkit (docs/extending.md).

mdmkit finds them through their config groups in my_conf/, added with `hydra.searchpath=[file://my_conf]`;
this directory must be importable (run from it, or put it on PYTHONPATH).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from mdmkit.core.config import require
from mdmkit.objectives import MaskedDiffusionLoss
from mdmkit.objectives.masked_diffusion import Corruption
from mdmkit.samplers import MaskedSampler
from mdmkit.samplers.core.budget import Ranked
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


@dataclass
class CosineMaskingLoss(MaskedDiffusionLoss):
    """Masked diffusion with a cosine masking schedule: t = 1 - cos(pi u / 2), u ~ U(0, 1), so that lightly masked
    sequences (the last steps of sampling) are drawn more often; mean cross-entropy over masked tokens."""

    weighting: Literal["elbo", "uniform"] = "uniform"  # the ELBO's 1/t weight belongs to the linear schedule

    def validate(self) -> None:
        super().validate()
        require(self.weighting == "uniform", f"weighting={self.weighting}: the cosine schedule trains with 'uniform'")

    def corrupt(self, tokens: torch.Tensor, answer_mask: torch.Tensor, mask_id: int,
                generator: torch.Generator | None) -> Corruption:
        u = torch.rand(tokens.shape[0], generator=generator, device=tokens.device)
        t = (1.0 - torch.cos(0.5 * math.pi * u)).clamp(min=self.t_min)
        masked = (torch.rand(tokens.shape, generator=generator, device=tokens.device) < t[:, None]) & answer_mask
        return Corruption(torch.where(masked, mask_id, tokens), masked, t)

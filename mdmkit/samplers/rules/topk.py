"""Top-k: a fixed number of positions per step (k = 1 is full-step sampling: one token per forward pass)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.masked import MaskedSampler


@dataclass(frozen=True)
class FixedCount:
    """Top-k: k positions per step."""

    k: int

    def __post_init__(self) -> None:
        require(self.k >= 1, f"k={self.k} must be >= 1")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return torch.full_like(ranked.n_eligible, self.k)


@dataclass
class TopKSampler(MaskedSampler):
    """Reveal the k best positions per step (k = 1 is full-step sampling: one token per forward pass)."""

    budget_rule = FixedCount
    k: int = 1

"""Fast-dLLM's confidence threshold: every position at or above `tau`, at least the best one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Ranked, prefix_length
from mdmkit.samplers.core.masked import MaskedSampler


@dataclass(frozen=True)
class ConfidenceThreshold:
    """Fast-dLLM threshold: every ranked position whose confidence is >= tau (a prefix under confidence order)."""

    tau: float

    def __post_init__(self) -> None:
        require(0.0 < self.tau <= 1.0, f"tau={self.tau} must lie in (0, 1]")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return prefix_length((ranked.confidence >= self.tau) & ranked.valid)


@dataclass
class ThresholdSampler(MaskedSampler):
    """Fast-dLLM threshold: every position with confidence >= tau, at least the best one."""

    budget_rule = ConfidenceThreshold
    tau: float = 0.9

"""Fast-dLLM's factor rule, as its paper states it and as its code applies it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Ranked, prefix_length
from mdmkit.samplers.core.masked import MaskedSampler


@dataclass(frozen=True)
class ConfidenceFactor:
    """Fast-dLLM's factor rule as its paper states it: the largest n with (n + 1) * (1 - c_(n)) < f, c_(n) the
    n-th ranked confidence (none: the loop reveals one). `FastDllmFactor` is the rule as its code applies it."""

    factor: float

    def __post_init__(self) -> None:
        require(self.factor > 0.0, f"factor={self.factor} must be > 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        n = torch.arange(1, ranked.confidence.shape[1] + 1, device=ranked.confidence.device)
        holds = (n[None, :] + 1) * (1.0 - ranked.confidence) < self.factor
        return prefix_length(holds & ranked.valid)


@dataclass(frozen=True)
class FastDllmFactor:
    """Fast-dLLM's factor rule as its code applies it (`get_transfer_index_dynamic`, NVlabs/Fast-dLLM): the leading
    run of ranked positions n (1-based) with c_(n) >= 1 - f / (n + 1) in float64 (the first always passes), and the
    last eligible one too when the run covers all the others (so two masked positions are always revealed together)."""

    factor: float

    def __post_init__(self) -> None:
        require(self.factor > 0.0, f"factor={self.factor} must be > 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        n = torch.arange(1, ranked.confidence.shape[1] + 1, device=ranked.confidence.device, dtype=torch.float64)
        passes = ranked.confidence.double() >= 1.0 - self.factor / (n[None, :] + 1.0)
        passes[:, 0] = True
        run = prefix_length(passes & ranked.valid)
        return torch.where(run >= ranked.n_eligible - 1, ranked.n_eligible, run)


@dataclass
class FactorSampler(MaskedSampler):
    """Fast-dLLM's factor rule as its paper states it: the largest n with (n + 1) * (1 - c_(n)) < factor."""

    budget_rule = ConfidenceFactor
    factor: float = 1.0


@dataclass
class FastDllmFactorSampler(MaskedSampler):
    """Fast-dLLM's factor rule as its code applies it (FastDllmFactor), in blocks of 32 as its scripts."""

    budget_rule = FastDllmFactor
    factor: float = 1.0
    block_length: int | None = 32
    mask_in_softmax: bool = True  # as the code scores

"""EB-Sampler (Ben-Hamu et al. 2025): the entropy bound and the sampler that reveals by it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.masked import MaskedSampler


@dataclass(frozen=True)
class EntropyBound:
    """EB-Sampler (Ben-Hamu et al. 2025, eq. 2): the largest ranked prefix S with
    sum_{i in S} H_i - max_{i in S} H_i <= gamma. gamma = 0 reveals one token (unless ties at zero entropy)."""

    gamma: float

    def __post_init__(self) -> None:
        require(self.gamma >= 0.0, f"gamma={self.gamma} must be >= 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        entropy = ranked.entropy.masked_fill(~ranked.valid, 0.0)
        excess = entropy.cumsum(1) - entropy.cummax(1).values  # non-decreasing along the prefix
        return ((excess <= self.gamma) & ranked.valid).sum(1)


@dataclass
class EBSampler(MaskedSampler):
    """EB-Sampler: reveal the largest ranked prefix whose entropy sum minus its max entropy is <= gamma."""

    budget_rule = EntropyBound
    gamma: float = 0.1

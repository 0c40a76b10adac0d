"""Every eligible position in one step: one forward per block."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.masked import MaskedSampler


@dataclass(frozen=True)
class RevealAll:
    """Every eligible position at once (one-shot decoding of a block)."""

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return ranked.n_eligible.clone()


@dataclass
class RevealAllSampler(MaskedSampler):
    """Every eligible position in one step (one forward per block)."""

    budget_rule = RevealAll

"""What every budget rule shares: how many of this step's sorted eligible positions to reveal, per row.

Top-k, step schedules, EB-Sampler, Fast-dLLM threshold and factor differ only there: each rule lives in one file with
its sampler and checks the ranges of its own parameters, once for every sampler that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Ranked:
    """One step's eligible positions, sorted best first; columns past `n_eligible` are padding."""

    entropy: torch.Tensor  # [R, L] nats, in ranked order (padding: 0)
    confidence: torch.Tensor  # [R, L] probability of the chosen token, in ranked order (padding: 0)
    n_eligible: torch.Tensor  # [R]
    step_in_block: torch.Tensor  # [R] steps already taken in the current block
    block_size: torch.Tensor  # [R] eligible positions when the current block started
    error: torch.Tensor | None = None  # [R, L] the ordering's scores, ascending (padding: inf); None: not given

    @property
    def valid(self) -> torch.Tensor:
        columns = torch.arange(self.confidence.shape[1], device=self.confidence.device)
        return columns[None, :] < self.n_eligible[:, None]


class Budget(Protocol):
    def __call__(self, ranked: Ranked) -> torch.Tensor:
        """Number of leading ranked positions to reveal, per row (clamped to [1, n_eligible] by the loop, or
        to [0, n_eligible] with `empty_steps`)."""


def prefix_length(holds: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row."""
    return holds.long().cumprod(1).sum(1)

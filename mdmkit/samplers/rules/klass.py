"""KLASS (KL-Adaptive Stability Sampling): reveal what is confident and has stopped moving.

Kim et al., "KLASS: KL-Guided Fast Inference in Masked Diffusion Models" (NeurIPS 2025, arXiv 2511.05664); code:
shkim0116/KLASS (`stable_confident_decode`). A masked position of the block qualifies once its last `history_length`
KLs from the previous step's distribution are < `kl_threshold` and its chosen token's probability is >
`conf_threshold`; every qualifying one is revealed, else the fallback budget (`steps`) decides. A position's history
starts with its block (the code tracks it from the first step). Details: docs/samplers.md ("KLASS, Credit decoding
and Prophet"). The previous distributions are memory, not NFE: one float32 [B, answer columns, V] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Budget
from mdmkit.samplers.core.masked import MaskedSampler, StepRule
from mdmkit.samplers.rules.steps import StepSchedule
from mdmkit.samplers.rules.topk import FixedCount

KL_EPS = 1e-12  # the code's eps inside both logarithms


def kl_to_previous(probs: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """KL(probs || previous) over the last axis in float64, with the code's eps inside the logarithms."""
    p, q = probs.double(), previous.double()
    return (p * ((p + KL_EPS).log() - (q + KL_EPS).log())).sum(-1)


class _Stability(StepRule):
    """Per row and position: the previous distribution and how many consecutive KLs were below the bound."""

    def __init__(self, answer: torch.Tensor, rule: Stability) -> None:
        super().__init__(answer)
        self.rule = rule
        self.previous: torch.Tensor | None = None  # [B, W, V], made at the first step (V known then)
        self.seen = torch.zeros(answer.shape[0], self.width, dtype=torch.bool, device=answer.device)
        self.calm = torch.zeros(answer.shape[0], self.width, dtype=torch.long, device=answer.device)

    def pick(self, rows: torch.Tensor, span: slice, probs: torch.Tensor, chosen_prob: torch.Tensor,
             candidates: torch.Tensor) -> torch.Tensor:
        columns = self.columns(span)
        if self.previous is None:
            self.previous = probs.new_zeros(self.seen.shape[0], self.width, probs.shape[-1])
        previous, seen, calm = self.previous[rows, columns], self.seen[rows, columns], self.calm[rows, columns]
        below = seen & (kl_to_previous(probs, previous) < self.rule.kl_threshold)
        calm = torch.where(candidates, torch.where(below, calm + 1, 0), calm)
        self.calm[rows, columns] = calm
        self.seen[rows, columns] = seen | candidates
        self.previous[rows, columns] = torch.where(candidates[..., None], probs, previous)
        return candidates & (calm >= self.rule.history_length) & (chosen_prob > self.rule.conf_threshold)


@dataclass(frozen=True)
class Stability:
    """KLASS's test (see the module): confidence > conf_threshold and the last history_length KLs < kl_threshold."""

    conf_threshold: float
    kl_threshold: float
    history_length: int

    def __post_init__(self) -> None:
        require(0.0 <= self.conf_threshold < 1.0, f"conf_threshold={self.conf_threshold} must lie in [0, 1)")
        require(self.kl_threshold > 0.0, f"kl_threshold={self.kl_threshold} must be > 0")
        require(self.history_length >= 1, f"history_length={self.history_length} must be >= 1")

    def start(self, answer: torch.Tensor) -> StepRule:
        return _Stability(answer, self)


@dataclass
class KlassSampler(MaskedSampler):
    """KLASS: reveal every confident position whose distribution has stopped changing; else the fallback budget."""

    step_rule = Stability
    conf_threshold: float = 0.9  # a qualifying position's chosen token has probability > conf_threshold
    kl_threshold: float = 0.01  # ... and its last history_length KL(p_t || p_t-1) are all < kl_threshold
    history_length: int = 2  # consecutive steps the KL must stay below kl_threshold
    steps: int | None = None  # the fallback: None reveals the most confident one; n: LLaDA's schedule of n steps

    def validate(self) -> None:
        super().validate()
        self.budget()  # steps: checked by the schedule

    def budget(self) -> Budget:
        return FixedCount(1) if self.steps is None else StepSchedule(self.steps)

"""NI sampling (Neural-Indicator sampling, ICLR 2026): a learned indicator decides what else to reveal now.

After each forward, a position-level indicator (trained by mdmkit.training.indicator to recognise positions whose
reveal now keeps the base sampler's trajectory) scores every masked position; every eligible one scoring >= epsilon
is revealed with what the base `MaskedSampler` reveals. epsilon = 1 is the base sampler alone (the indicator never
runs), 0 reveals every eligible position at once. Indicator passes are charged (kind "indicator").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mdmkit.core.config import require
from mdmkit.models.denoiser import HIDDEN_STATES, without_mask
from mdmkit.models.indicator import IndicatorScorer
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler, StepRule
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.topk import TopKSampler

# (masked [R, L], logits [R, L, V] with the mask token at -inf, last hidden state [R, L, D]) -> log-odds
Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def log_odds_threshold(epsilon: float) -> float:
    """score >= epsilon  <=>  log-odds >= this (-inf at 0, +inf at 1)."""
    if epsilon <= 0.0:
        return -math.inf
    if epsilon >= 1.0:
        return math.inf
    return math.log(epsilon) - math.log1p(-epsilon)


@dataclass
class NISampler(Sampler):
    """`base` plus every masked position the indicator scores >= `epsilon`. `indicator` is a loaded `Scorer`
    (evaluation loads an `IndicatorScorer`); its passes cost `indicator_cost` base forwards each (default: its
    parameter share of the base network; 1 for a scorer of unknown size)."""

    base: MaskedSampler = field(default_factory=TopKSampler)
    indicator: Any = None  # path to indicator.pt (tied to the base checkpoint it was trained on)
    epsilon: float = 0.9  # 1: the base sampler alone; lower: more reveals per step
    indicator_cost: float | None = None  # an indicator pass in base forwards (None: its parameter share)

    def validate(self) -> None:
        require(0.0 <= self.epsilon <= 1.0, f"epsilon={self.epsilon} must lie in [0, 1]")
        require(self.indicator is None or callable(self.indicator),
                "indicator must be a loaded scorer (evaluation loads sampler.indicator=<indicator.pt>)")
        require(self.indicator_cost is None or self.indicator_cost >= 0.0,
                f"indicator_cost={self.indicator_cost} must be >= 0 or null")
        require(self.epsilon >= 1.0 or self.base.cache == "none",
                f"cache={self.base.cache} is not supported under NI sampling (its indicator reads the hidden states "
                f"of full forwards): give its base sampler cache=none")

    @property
    def requires(self) -> frozenset[str]:
        """The base sampler's needs, and the hidden states the indicator reads unless epsilon = 1 never runs it."""
        return self.base.requires | (frozenset() if self.epsilon >= 1.0 else frozenset({HIDDEN_STATES}))

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """The base sampler's `sample`; each step also reveals the eligible positions the indicator passes."""
        threshold = log_odds_threshold(self.epsilon)
        if threshold == math.inf:
            return self.base.fill(network, canvas)
        require(self.indicator is not None,
                "NI sampling needs an indicator: pass sampler.indicator=path/to/indicator.pt")
        scorer = self.indicator
        share = self.indicator_cost
        if share is None:
            share = network.share_of(scorer.indicator) if isinstance(scorer, IndicatorScorer) else 1.0

        answer = canvas.tokens == canvas.mask_id
        rule = IndicatorRule(answer, scorer, threshold, share, network, canvas.mask_id)
        return self.base.fill_with(network, canvas, rule)


class IndicatorRule(StepRule):
    """Each step also reveals the eligible positions whose indicator log-odds reach `threshold`, read from the
    forward's logits (the mask token ruled out) and last hidden state; the indicator's cost is charged to the
    rows as a `share` of a forward."""

    needs_hidden = True
    reads_canvas = True

    def __init__(self, answer: torch.Tensor, scorer: Callable[..., torch.Tensor], threshold: float, share: float,
                 network: ForwardCounter, mask_id: int) -> None:
        super().__init__(answer)
        self.scorer, self.threshold, self.share = scorer, threshold, share
        self.network, self.mask_id = network, mask_id

    def also(self, rows: torch.Tensor, state: torch.Tensor, logits: torch.Tensor,
             hidden: torch.Tensor | None) -> torch.Tensor:
        self.network.charge(rows, self.share, "indicator")
        return self.scorer(state == self.mask_id, without_mask(logits, self.mask_id), hidden) >= self.threshold

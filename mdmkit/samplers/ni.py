"""NI sampling (Neural-Indicator sampling, ICLR 2026): a learned indicator decides what else to reveal now.

After each network forward, a small position-level indicator scores every masked position; every eligible
position whose score is >= epsilon is revealed together with what the base sampler's budget rule reveals (so
at least one per step). The indicator is trained (mdmkit.indicator) to recognise positions whose reveal now
keeps the base sampler's trajectory, so a good indicator approaches the oracle floor. Any `MaskedSampler` is a
base: its ordering, choice, blocks and budget rule are unchanged. epsilon is the speed / accuracy knob: 1 is
the base sampler alone (no finite score reaches 1, so the indicator is not even run), 0 reveals every eligible
position at once. Indicator passes are charged to the forward counter (kind "indicator") at their share of a
base forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mdmkit.config import Validated, require
from mdmkit.indicator.model import IndicatorScorer, tapped_hidden
from mdmkit.samplers.counting import ForwardCounter
from mdmkit.samplers.masked import MaskedSampler, Sampled, TopKSampler
from mdmkit.samplers.stopping import StopCondition

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
class NISampler(Validated):
    """`base` plus every masked position the indicator scores >= `epsilon`.

    `indicator` is an indicator checkpoint (loaded on first use, checked against the base network);
    `set_indicator` installs any scorer instead. Its passes cost `indicator_cost` base forwards each
    (default: the indicator's parameter share of the base network; 1 for a scorer of unknown size).
    """

    base: MaskedSampler = field(default_factory=TopKSampler)
    indicator: str | None = None
    epsilon: float = 0.9
    indicator_cost: float | None = None

    # class attributes, not config fields: set by set_indicator, or on first use from `indicator`
    _scorer = None
    _trained = None
    _checked = None  # the base network the trained indicator was last checked against

    def validate(self) -> None:
        require(0.0 <= self.epsilon <= 1.0, f"epsilon={self.epsilon} must lie in [0, 1]")
        require(self.indicator is None or Path(self.indicator).expanduser().is_file(),
                f"indicator={self.indicator}: no such checkpoint")
        require(self.indicator_cost is None or self.indicator_cost >= 0.0,
                f"indicator_cost={self.indicator_cost} must be >= 0 or null")

    def set_indicator(self, scorer: Scorer | None) -> NISampler:
        """Score with `scorer` instead of the `indicator` checkpoint."""
        self._scorer = scorer
        return self

    def scorer(self, network: nn.Module) -> Scorer:
        """The scorer for `network`, loading and checking the checkpoint the first time it is needed."""
        if self._scorer is not None:
            return self._scorer
        require(self.indicator is not None,
                "NI sampling needs an indicator: pass sampler.indicator=path/to/indicator.pt")
        if self._trained is None:
            from mdmkit.indicator.checkpoint import load_indicator  # only runs that use a checkpoint load it

            self._trained = load_indicator(self.indicator)
        if self._checked is not network:
            self._trained.check(network)
            self._checked = network
        device = next(network.parameters()).device
        return IndicatorScorer(self._trained.indicator.to(device), network.embed)

    def share(self, scorer: Scorer, network: nn.Module) -> float:
        """Cost of one indicator pass in base forwards."""
        if self.indicator_cost is not None:
            return self.indicator_cost
        return scorer.share(network) if isinstance(scorer, IndicatorScorer) else 1.0

    @torch.no_grad()
    def sample(
        self,
        network: ForwardCounter,
        tokens: torch.Tensor,
        mask_id: int,
        generator: torch.Generator | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        stop: StopCondition | None = None,
    ) -> Sampled:
        """The base sampler's `sample`; each step also reveals the eligible positions the indicator passes."""
        threshold = log_odds_threshold(self.epsilon)
        if threshold == math.inf:
            return self.base.sample(network, tokens, mask_id, generator,
                                    attention_mask=attention_mask, stop=stop)
        scorer = self.scorer(network.network)
        share = self.share(scorer, network.network)
        with tapped_hidden(network.network) as tap:

            def reveal_also(rows: torch.Tensor, state: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
                network.charge(rows, share, "indicator")
                return scorer(state == mask_id, logits, tap["hidden"]) >= threshold

            return self.base.sample(network, tokens, mask_id, generator,
                                    attention_mask=attention_mask, stop=stop, reveal_also=reveal_also)

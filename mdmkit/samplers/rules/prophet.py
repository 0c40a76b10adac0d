"""Prophet: early answer commit, a stopping rule on top of any masked-loop sampler.

Li et al. 2025, "Diffusion Language Models Know the Answer Before Decoding" (arXiv 2508.19982); code: pixeli99/Prophet
(`should_early_exit`). After each forward, before the step reveals anything, a row whose mean top-2 logit gap over
its still-masked positions reaches a threshold falling with progress (the share of its answer revealed) commits:
every masked position, in every block, takes this step's choice. The commit's forward counts in NFE. Where this port
departs from the paper and code, and why: docs/samplers.md ("KLASS, Credit decoding and Prophet").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mdmkit.core.config import require
from mdmkit.models.denoiser import without_mask
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler, StepRule
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.steps import StepsSampler


def mean_gap(logits: torch.Tensor, masked: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Per row, the mean over its `masked` positions [R, L] of the top-2 logit gap (`logits` [R, L, V], the mask
    token excluded), in float32."""
    where = masked.nonzero(as_tuple=True)
    values = without_mask(logits[where], mask_id)
    top = values.topk(2, dim=-1).values
    total = torch.zeros(masked.shape[0], device=logits.device).index_add_(0, where[0], top[:, 0] - top[:, 1])
    return total / masked.sum(1).clamp(min=1)


class _EarlyCommit(StepRule):
    reads_canvas = True

    def __init__(self, answer: torch.Tensor, rule: CommitGap, mask_id: int) -> None:
        super().__init__(answer)
        self.rule, self.mask_id = rule, mask_id
        self.answer = answer.sum(1)

    def commit(self, rows: torch.Tensor, logits: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        return mean_gap(logits, masked, self.mask_id) >= self.rule.threshold(1.0 - masked.sum(1) / self.answer[rows])


@dataclass(frozen=True)
class CommitGap:
    """Prophet's test (see the module): the mean top-2 logit gap against a threshold falling with progress."""

    gap_early: float
    gap_mid: float
    gap_late: float
    early_until: float
    mid_until: float

    def __post_init__(self) -> None:
        for name in ("gap_early", "gap_mid", "gap_late"):
            require(getattr(self, name) >= 0.0, f"{name}={getattr(self, name)} must be >= 0")
        require(0.0 <= self.early_until <= 1.0, f"early_until={self.early_until} must lie in [0, 1]")
        require(self.early_until <= self.mid_until <= 1.0,
                f"mid_until={self.mid_until} must lie in [early_until={self.early_until}, 1]")

    def threshold(self, progress: torch.Tensor) -> torch.Tensor:
        """The gap a row needs at `progress` [R] (share of its answer revealed)."""
        return torch.where(progress < self.early_until, self.gap_early,
                           torch.where(progress < self.mid_until, self.gap_mid, self.gap_late))

    def start(self, answer: torch.Tensor, mask_id: int) -> StepRule:
        return _EarlyCommit(answer, self, mask_id)


@dataclass
class ProphetSampler(Sampler):
    """`base` (any masked-loop sampler) until the row's mean top-2 logit gap clears the threshold, then all-in."""

    base: MaskedSampler = field(default_factory=lambda: StepsSampler(steps=32, block_length=32, mask_in_softmax=True))
    gap_early: float = 8.0  # the gap needed while < early_until of the answer is revealed (the paper's thresholds)
    gap_mid: float = 5.0  # ... while < mid_until
    gap_late: float = 3.0  # ... after
    # end of the early phase, as the share of the row's answer already revealed (the code's bounds)
    early_until: float = 0.33
    mid_until: float = 0.67  # end of the middle phase (gap_late from here on)

    def validate(self) -> None:
        self.rule()
        require(self.base.cache == "none", f"cache={self.base.cache} is not supported under Prophet (its gap reads "
                                           f"the logits of every masked position): give its base sampler cache=none")

    @property
    def requires(self) -> frozenset[str]:
        return self.base.requires

    def rule(self) -> CommitGap:
        return CommitGap(self.gap_early, self.gap_mid, self.gap_late, self.early_until, self.mid_until)

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """The base sampler's loop with the early commit after every forward."""
        answer = canvas.tokens == canvas.mask_id
        return self.base.fill_with(network, canvas, self.rule().start(answer, canvas.mask_id))

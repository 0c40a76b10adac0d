"""Token editing (LLaDA2.1's T2T): any masked-loop sampler whose decided tokens can still change.

The base sampler reveals masked positions as always (mask to token). On the same forward, every decided position of
the row's current block whose token the step's choice would replace, with probability above `threshold`, is
rewritten (token to token); the scores are the base sampler's (its temperature, top_p and `mask_in_softmax`). Once
the block holds no mask, up to `post_steps` more forwards do nothing but edit, and the first that edits nothing ends
the block. Those forwards are counted like any other (core/editing.py keeps them). `threshold >= 1` never edits, but
`post_steps` still spends its forward on each full block, as LLaDA2.1's generate does: `post_steps: 0` is the base
sampler exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.counting import CountedNetwork
from mdmkit.samplers.core.editing import token_edits
from mdmkit.samplers.core.masked import MaskedSampler, StepRule
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.threshold import ThresholdSampler


class _Edit(StepRule):
    def __init__(self, answer: torch.Tensor, threshold: float, post_steps: int) -> None:
        super().__init__(answer)
        self.threshold, self.post_steps = threshold, post_steps

    def revise(self, rows: torch.Tensor, span: slice, state: torch.Tensor, choice: torch.Tensor,
               chosen_prob: torch.Tensor, editable: torch.Tensor) -> torch.Tensor:
        return token_edits(choice, chosen_prob, state, editable, self.threshold)


RuleT = TypeVar("RuleT", bound=Sampler)


@dataclass
class EditingSampler(Sampler):
    """`base` (any masked-loop sampler) with token editing and post steps (see the module)."""

    base: MaskedSampler = field(default_factory=ThresholdSampler)
    threshold: float = 0.9  # rewrite a decided token where the step prefers another above this probability
    post_steps: int = 16  # forwards a full block may take to edit, ending at the first that edits nothing

    def validate(self) -> None:
        require(self.threshold >= 0.0, f"threshold={self.threshold} must be >= 0 (1 or more: never edit)")
        require(self.post_steps >= 0, f"post_steps={self.post_steps} must be >= 0")

    @property
    def requires(self) -> frozenset[str]:
        return self.base.requires

    # what a block walk reads of the rule filling its blocks (block_walk.BlockRule): the base sampler's
    @property
    def temperature(self) -> float:
        return self.base.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.base.temperature = value

    @property
    def top_p(self) -> float:
        return self.base.top_p

    @top_p.setter
    def top_p(self, value: float) -> None:
        self.base.top_p = value

    @property
    def stop_early(self) -> bool:
        return self.base.stop_early

    @stop_early.setter
    def stop_early(self, value: bool) -> None:
        self.base.stop_early = value

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled:
        """The base sampler's loop with the edits after every forward."""
        rule = _Edit(canvas.tokens == canvas.mask_id, self.threshold, self.post_steps)
        return self.base.fill_with(network, canvas, rule)


def revealed_by(rule: EditingSampler | RuleT) -> MaskedSampler | RuleT:
    """The sampler whose budget reveals a rule's tokens: an editing rule's `base`, else the rule itself."""
    return rule.base if isinstance(rule, EditingSampler) else rule

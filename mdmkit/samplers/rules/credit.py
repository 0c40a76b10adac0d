"""Credit decoding: threshold decoding on logits boosted by each token's accumulated credit.

Wang et al. 2025, "CreditDecoding" (arXiv 2510.06133); code: `CreditThresholdParallelDecoder` in inclusionAI/dInfer.
Each step a masked position's credits decay (C <- decay * C) and its top-1 token of the untempered softmax gains
p ** boost; the step chooses and scores from logits + fusion_weight * log(1 + C), so credit can change the token, and
Fast-dLLM's threshold reveals. A position is credited only while eligible (the code's per-block matrix). Defaults and
differences: docs/samplers.md ("KLASS, Credit decoding and Prophet"). The credits are memory, not NFE: one float32
[B, answer columns, V] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.masked import MaskedSampler, StepRule
from mdmkit.samplers.rules.threshold import ConfidenceThreshold


class _Credits(StepRule):
    """Per row, position and token: the decayed sum of the step's boosted top-1 probabilities."""

    def __init__(self, answer: torch.Tensor, rule: TraceCredit) -> None:
        super().__init__(answer)
        self.rule, self.batch = rule, answer.shape[0]
        self.credit: torch.Tensor | None = None  # [B, W, V], made at the first step (V known then)

    def fuse(self, rows: torch.Tensor, span: slice, logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        columns = self.columns(span)
        if self.credit is None:
            self.credit = logits.new_zeros(self.batch, self.width, logits.shape[-1])
        top, token = logits.softmax(-1).max(-1)
        gain = top.pow(self.rule.boost) * candidates
        credit = self.credit[rows, columns] * self.rule.decay
        credit.scatter_add_(-1, token[..., None], gain[..., None])
        credit = torch.where(candidates[..., None], credit, 0.0)  # credited only while eligible
        self.credit[rows, columns] = credit
        return logits + self.rule.fusion_weight * credit.log1p()


@dataclass(frozen=True)
class TraceCredit:
    """Credit decoding's credits (see the module): decay, boost exponent and fusion weight."""

    fusion_weight: float
    boost: float
    decay: float

    def __post_init__(self) -> None:
        require(self.fusion_weight >= 0.0, f"fusion_weight={self.fusion_weight} must be >= 0")
        require(self.boost >= 0.0, f"boost={self.boost} must be >= 0")
        require(0.0 <= self.decay <= 1.0, f"decay={self.decay} must lie in [0, 1]")

    def start(self, answer: torch.Tensor) -> StepRule:
        return _Credits(answer, self)


@dataclass
class CreditSampler(MaskedSampler):
    """Credit decoding: Fast-dLLM's threshold on logits fused with each token's accumulated credit."""

    budget_rule = ConfidenceThreshold
    step_rule = TraceCredit
    tau: float = 0.9  # reveal every position whose fused confidence is >= tau (at least the best one)
    fusion_weight: float = 0.7  # fused logits = logits + fusion_weight * log(1 + credit) (the code's credit_alpha)
    boost: float = 0.2  # a step's top-1 token gains p ** boost credit (boost_gamma)
    decay: float = 0.8  # every credit is multiplied by decay each step (decay_beta)

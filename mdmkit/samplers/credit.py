"""Credit decoding: threshold decoding on logits boosted by each token's accumulated credit.

Wang, Jiang, Feng, Zhao, Liu, Li, Lan and Lin, "CreditDecoding: Accelerating Parallel Decoding in Diffusion Large
Language Models with Trace Credits" (arXiv 2510.06133); public code: the `CreditThresholdParallelDecoder` of
inclusionAI/dInfer (python/dinfer/decoding/parallel_strategy.py), by the paper's group (Ant Group). A masked position
keeps a credit C(v) for every token v, from the step its block starts:

- each step every credit decays, C <- decay * C, then the step's top-1 token v* (of the untempered softmax of the
  logits, the mask token excluded) gains p(v*) ** boost: C(v*) <- C(v*) + p(v*) ** boost;
- the step's logits become logits + fusion_weight * log(1 + C), and the step chooses and scores from them: the
  token is chosen from the fused distribution (its argmax at T = 0), so credit can change the token, not only when
  it is revealed;
- the budget is Fast-dLLM's threshold on the fused confidence: every position >= tau, at least the best one.

Defaults are the code's (credit_alpha 0.7, boost_gamma 0.2, decay_beta 0.8) with its benchmark scripts' threshold
0.9. The code keeps one credit matrix per block and only for the block (its logits cover the block alone): the same as
crediting a position only while it is eligible, as here. Its threshold step also reveals positions within 1e-5 of the
best when none reaches tau (here only the best); at T > 0 it scores with the untempered fused softmax (here the
tempered one, as every masked-loop rule). The credits are memory, not NFE: one float32 [B, answer columns, V] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.masked import MaskedSampler, StepRule
from mdmkit.samplers.threshold import ConfidenceThreshold


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
    tau: float = 0.9
    fusion_weight: float = 0.7
    boost: float = 0.2
    decay: float = 0.8

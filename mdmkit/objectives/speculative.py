"""The loss of "Self-Speculative Masked Diffusions" (eq. 9): draft and target cross-entropies from one pass.

The answer tokens are masked as for an MDM (`MaskedDiffusionLoss.corrupt`). The non-causal term is the trunk's
cross-entropy on the masked positions; the causal term is an autoregressive cross-entropy over the same
positions in a uniformly random order σ (known positions first, as the network expects). Each is divided by
the sequence's number of masked positions and averaged over the sequences that have any; both are logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from mdmkit.core.config import Validated
from mdmkit.models.speculative import SpeculativeConfig, SpeculativeTransformer
from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss


def per_sequence_ce(logits: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy summed over its masked positions over their number, averaged over rows."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens, reduction="none") * masked
    count = masked.sum(1)
    return (ce.sum(1) / count.clamp(min=1)).sum() / (count > 0).sum().clamp(min=1)


def random_order(masked: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """σ [B, L]: the unmasked positions in index order, then the masked ones in a uniformly random order."""
    keys = torch.rand(masked.shape, generator=generator, device=masked.device)
    return torch.where(masked, 1.0 + keys, 0.0).argsort(dim=1, stable=True)


@dataclass
class SpeculativeLoss(Validated):
    """Eq. 9: masked CE of the draft + AR CE of the causal target, each normalised by the masked count; `t_min`
    and `stratified` draw the masking rate as in `MaskedDiffusionLoss`."""

    model_spec: ClassVar[type] = SpeculativeConfig  # the network it trains: a draft trunk and a causal verifier

    t_min: float = 1e-3
    stratified: bool = True

    def validate(self) -> None:
        MaskedDiffusionLoss(t_min=self.t_min, stratified=self.stratified)  # the same range checks

    def __call__(
        self,
        network: SpeculativeTransformer,
        tokens: torch.Tensor,
        answer_mask: torch.Tensor,
        mask_id: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        corruption = MaskedDiffusionLoss(t_min=self.t_min, stratified=self.stratified).corrupt(
            tokens, answer_mask, mask_id, generator)
        masked = corruption.masked
        order = random_order(masked, generator)
        trunk = network.noncausal(corruption.noisy)
        target = network.causal(trunk, tokens, order, (~masked).sum(1))
        draft_ce = per_sequence_ce(trunk.logits, tokens, masked)
        causal_ce = per_sequence_ce(target, tokens, masked)
        with torch.no_grad():
            count = masked.sum().clamp(min=1)
            metrics = {
                "noncausal_ce": draft_ce.detach(),
                "causal_ce": causal_ce.detach(),
                "masked_acc": ((trunk.logits.argmax(-1) == tokens) & masked).sum() / count,
                "causal_acc": ((target.argmax(-1) == tokens) & masked).sum() / count,
            }
        return draft_ce + causal_ce, metrics

"""Masked diffusion loss for time-agnostic MDMs (the objective of the EB-Sampler paper's small models)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from mdmkit.core.config import Validated, require


@dataclass
class Corruption:
    noisy: torch.Tensor  # [B, L] tokens with masked answer positions replaced by the mask id
    masked: torch.Tensor  # [B, L] bool, True where a position was masked
    t: torch.Tensor  # [B] masking rate of each sequence


@dataclass
class MaskedDiffusionLoss(Validated):
    """Per sequence t ~ U(0,1); each answer position is masked with probability t; CE on masked positions.

    `weighting="elbo"` weights each masked token's CE by 1/t (the continuous-time ELBO); `normalize` then divides
    a sequence's sum by its answer length and averages the sequences (`"sequence"`: LLaDA's pre-training and SFT
    loss, whose EOS padding counts as answer), or divides the batch's sum by its answer tokens (`"tokens"`: Dream's
    SFT); the two agree when every answer has one length. `"uniform"` is the plain mean CE over all masked tokens
    of the batch. Prompt/given positions (answer_mask False) are never masked and never scored.
    """

    weighting: Literal["elbo", "uniform"] = "elbo"  # elbo (1/t) or uniform (mean CE over masked tokens)
    t_min: float = 1e-3
    stratified: bool = True
    # elbo: by answer length, mean over sequences (LLaDA) | tokens: by the batch's answer tokens (Dream SFT)
    normalize: Literal["sequence", "tokens"] = "sequence"

    def validate(self) -> None:
        require(0.0 < self.t_min < 1.0, f"t_min={self.t_min} must be in (0, 1)")
        require(self.normalize == "sequence" or self.weighting == "elbo",
                f"normalize={self.normalize} applies to weighting=elbo (uniform divides by the masked tokens)")

    def corrupt(
        self, tokens: torch.Tensor, answer_mask: torch.Tensor, mask_id: int, generator: torch.Generator | None,
    ) -> Corruption:
        batch = tokens.shape[0]
        u = torch.rand(batch if not self.stratified else 1, generator=generator, device=tokens.device)
        if self.stratified:  # one uniform shifted over B strata: same marginal, lower variance
            u = (u + torch.arange(batch, device=tokens.device) / batch) % 1.0
        t = self.t_min + (1.0 - self.t_min) * u
        draws = torch.rand(tokens.shape, generator=generator, device=tokens.device)
        masked = (draws < t[:, None]) & answer_mask
        return Corruption(torch.where(masked, mask_id, tokens), masked, t)

    def __call__(
        self,
        network: Callable[[torch.Tensor], torch.Tensor],
        tokens: torch.Tensor,
        answer_mask: torch.Tensor,
        mask_id: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.corrupt(tokens, answer_mask, mask_id, generator)
        logits = network(c.noisy)
        ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens, reduction="none") * c.masked
        n_masked = c.masked.sum().clamp(min=1)
        if self.weighting == "elbo" and self.normalize == "sequence":
            loss = (ce.sum(1) / c.t / answer_mask.sum(1).clamp(min=1)).mean()
        elif self.weighting == "elbo":
            loss = (ce.sum(1) / c.t).sum() / answer_mask.sum().clamp(min=1)
        else:
            loss = ce.sum() / n_masked
        with torch.no_grad():
            correct = (logits.argmax(-1) == tokens) & c.masked
            metrics = {"masked_ce": ce.sum() / n_masked, "masked_acc": correct.sum() / n_masked}
        return loss, metrics

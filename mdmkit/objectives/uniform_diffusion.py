"""Uniform-noise diffusion with self-conditioning: what a revisable canvas (RevisableSampler) asks of its network.

Revisable decoding starts from uniformly random tokens and renoises what it does not accept, so the network must map
a canvas of right and random tokens, plus its own previous guess, to the clean answer. The corruption is the uniform
forward process of discrete diffusion: per sequence t ~ U(t_min, 1), and each answer position is replaced, with
probability t, by a token drawn uniformly from the whole vocabulary (which may be the clean one:
q(x_t = x_0) = 1 - t + t / V). The loss is the cross-entropy of the clean token at every answer position (a
corrupted position may look clean, so every one is scored), averaged over the batch's answer positions.

Self-conditioning: a `self_conditioning` share of the rows first run without gradient, and the second pass reads
those logits (their givens pinned, as at decoding); the other rows read the signal of zeros, as a canvas's first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from mdmkit.core.config import Validated, require
from mdmkit.models.self_conditioned import SelfConditionedConfig, pin_givens
from mdmkit.objectives.masked_diffusion import Corruption, MaskedDiffusionLoss


def uniform_corrupt(tokens: torch.Tensor, answer_mask: torch.Tensor, vocab_size: int, t_min: float,
                    stratified: bool, generator: torch.Generator | None) -> Corruption:
    """The masked objective's draw of t and of the positions it hits (so the two objectives corrupt the same
    positions for a seed), each hit position then replaced by a uniform token of [0, vocab_size). `masked`: the
    positions replaced (the token drawn may equal the clean one)."""
    hit = MaskedDiffusionLoss(t_min=t_min, stratified=stratified).corrupt(tokens, answer_mask, -1, generator)
    noise = torch.randint(0, vocab_size, tokens.shape, generator=generator, device=tokens.device)
    return Corruption(torch.where(hit.masked, noise, tokens), hit.masked, hit.t)


@dataclass
class UniformDiffusionLoss(Validated):
    """Uniform-noise corruption at rate t ~ U(t_min, 1); CE of the clean token at every answer position, with
    self-conditioning on a `self_conditioning` share of the rows (see the module). Trains a `model=self_conditioned`
    network, decoded by `sampler=diffusion_gemma` (revisable canvases)."""

    model_spec: ClassVar[type] = SelfConditionedConfig  # a network that reads its previous logits and what to fill

    t_min: float = 1e-3
    stratified: bool = True
    self_conditioning: float = 0.5  # share of rows whose second pass reads a first pass's logits

    def validate(self) -> None:
        MaskedDiffusionLoss(t_min=self.t_min, stratified=self.stratified)  # the same range checks
        require(0.0 <= self.self_conditioning <= 1.0, f"self_conditioning={self.self_conditioning} must be in [0, 1]")

    def __call__(
        self,
        network: Callable[..., torch.Tensor],
        tokens: torch.Tensor,
        answer_mask: torch.Tensor,
        mask_id: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        vocab_size = int(network.config.vocab_size)  # type: ignore[attr-defined]  # a SelfConditionedTransformer
        c = uniform_corrupt(tokens, answer_mask, vocab_size, self.t_min, self.stratified, generator)
        rows = torch.rand(tokens.shape[0], generator=generator, device=tokens.device) < self.self_conditioning
        previous = None
        if bool(rows.any()):
            with torch.no_grad():
                first = network(c.noisy[rows], fill=answer_mask[rows])
                previous = first.new_zeros((*tokens.shape, first.shape[-1]))
                previous[rows] = pin_givens(first, tokens[rows], answer_mask[rows])
        logits = network(c.noisy, previous, fill=answer_mask, conditioned=rows)
        ce = F.cross_entropy(logits.transpose(1, 2).float(), tokens, reduction="none") * answer_mask
        n_answer = answer_mask.sum().clamp(min=1)
        loss = ce.sum() / n_answer
        with torch.no_grad():
            right = logits.argmax(-1) == tokens
            n_hit = c.masked.sum().clamp(min=1)
            metrics = {"answer_ce": loss.detach(), "answer_acc": (right & answer_mask).sum() / n_answer,
                       "masked_ce": (ce * c.masked).sum() / n_hit, "masked_acc": (right & c.masked).sum() / n_hit,
                       "self_conditioned": rows.float().mean()}
        return loss, metrics

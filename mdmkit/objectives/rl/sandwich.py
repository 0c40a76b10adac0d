"""SPG, the sandwiched policy gradient: a lower bound of a rollout's log-likelihood where its advantage is positive,
an upper bound (or a mix of the two) where it is not, each estimated under block-wise masks.

Raising a lower bound of log pi raises log pi, and lowering an upper bound lowers it; lowering the ELBO that the
other estimators estimate can widen its gap instead of lowering the likelihood. The upper bound is the Renyi-type
one, log pi <= (1/beta) log E[(1/t) [k masked] p(o_k | masked)^beta] per token. Block-wise masks follow how a
semi-autoregressive sampler decodes: the completion cut into blocks of `block_length` positions (in order: a
puzzle's answer positions, a text's generation), the blocks before a random one whole, the blocks after it masked,
and part of it masked. The loss (`SPGLoss`) is the advantage-weighted sum of these estimates, with no ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.objectives.rl.likelihood import LikelihoodEstimator, Network, token_log_probs
from mdmkit.objectives.rl.policy_loss import Metrics, PolicyLoss


@dataclass
class SandwichEstimator(LikelihoodEstimator):
    """SPG's estimates from `samples` block-wise masks per rollout. Draws, in this order: `torch.rand(K, B)` picks
    each sample's block j = floor(u x the completion's blocks); `torch.rand(K, B)` its count of masked positions,
    uniform on {lo, ..., hi}, lo = max(1, floor(m t_min)), hi = max(lo, min(m, floor(m t_max))) for the block's m
    positions; `torch.rand(K, B, L)` which of them (the `count` smallest draws of the block); `torch.rand(K, B, L)`
    < `p_mask` the other positions (the prompt) masked too. The blocks after j are masked whole.

    With t = a sample's masked share of the completion and p_k the probability of token k from that sample's
    forward: the lower bound's per-token value is the mean over samples of [k masked] log p_k / t (its sum, the
    ELBO estimated with the sample's own t); the upper bound's is (1/beta) log of the mean over samples of [k masked]
    p_k^beta / t, averaged over the tokens some sample masked and scaled to the completion's length. Rows whose
    advantage is > 0 get the lower bound; the others `mix` x the upper + (1 - mix) x the lower (1: the upper bound
    alone, SPG's EUBO; 0.5: its mixture). `samples` forwards."""

    samples: int = 2
    block_length: int = 32
    t_min: float = 0.0
    t_max: float = 1.0
    p_mask: float = 0.15
    beta: float = 1.0
    mix: float = 0.5

    def validate(self) -> None:
        require(self.samples >= 1, f"samples={self.samples} must be >= 1")
        require(self.block_length >= 1, f"block_length={self.block_length} must be >= 1")
        require(0.0 <= self.t_min <= self.t_max <= 1.0, f"t_min={self.t_min}, t_max={self.t_max}: need 0 <= t_min "
                "<= t_max <= 1 (the share of a block masked)")
        require(0.0 <= self.p_mask < 1.0, f"p_mask={self.p_mask} must lie in [0, 1)")
        require(self.beta > 0.0, f"beta={self.beta} must be > 0")
        require(0.0 <= self.mix <= 1.0, f"mix={self.mix} must lie in [0, 1]")

    @property
    def forwards(self) -> int:
        return self.samples

    def masks(self, completion: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """([K, B, L] completion positions masked, [K, B, L] other positions masked), drawn as the class says."""
        k, device, size = self.samples, completion.device, self.block_length
        length = completion.sum(1)  # [B]
        blocks = (length + size - 1) // size
        block_of = torch.where(completion, (completion.cumsum(1) - 1) // size, -1)  # [B, L]; -1: not the completion
        chosen = (torch.rand(k, *length.shape, generator=generator, device=device) * blocks).long()
        chosen = torch.minimum(chosen, (blocks - 1).clamp(min=0))  # [K, B]
        width = (length - chosen * size).clamp(min=0, max=size)
        low = torch.floor(width * self.t_min).long().clamp(min=1)
        high = torch.maximum(low, torch.minimum(width, torch.floor(width * self.t_max).long()))
        count = low + (torch.rand(k, *length.shape, generator=generator, device=device) * (high - low + 1)).long()
        count = torch.minimum(count, high)
        inside = block_of[None] == chosen[..., None]  # [K, B, L]
        order = torch.where(inside, torch.rand((k, *completion.shape), generator=generator, device=device), 2.0)
        rank = order.argsort(-1).argsort(-1)  # the block's positions take ranks 0 .. width - 1
        masked = (block_of[None] > chosen[..., None]) | (inside & (rank < count[..., None]))
        others = ~completion[None] & (torch.rand((k, *completion.shape), generator=generator, device=device)
                                      < self.p_mask)
        return masked, others

    def __call__(self, network: Network, tokens: torch.Tensor, completion: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
        require(advantages is not None, "SPG's estimator chooses its bound by the sign of each rollout's advantage: "
                "pass advantages")
        assert advantages is not None
        k = self.samples
        masked, others = self.masks(completion, generator)
        noisy = torch.where(masked | others, mask_id, tokens[None]).flatten(0, 1)
        logp = token_log_probs(network, noisy, tokens.repeat(k, 1)).view(k, *tokens.shape)
        length = completion.sum(1).to(logp.dtype)  # [B]
        inverse_t = length / masked.sum(2).clamp(min=1)  # [K, B]: 1 / the sample's masked share
        lower = torch.where(masked, logp * inverse_t[..., None], 0.0).mean(0)
        powered = torch.where(masked, torch.exp(self.beta * logp) * inverse_t[..., None], 0.0).mean(0)
        seen = powered > 0
        per_token = torch.where(seen, torch.log(torch.where(seen, powered, 1.0)) / self.beta, 0.0)
        upper = per_token * (length / seen.sum(1).clamp(min=1))[:, None]
        lowered = self.mix * upper + (1.0 - self.mix) * lower
        return torch.where((advantages > 0)[:, None], lower, lowered)


@dataclass
class SPGLoss(PolicyLoss):
    """SPG's loss: -sum_i A_i sum_k est_ik / sum_i |o_i|, the advantage-weighted bounds of `SandwichEstimator`
    (advantages r - the group's mean: `rl.scale_advantages: false`), over the batch's completion tokens. No ratio
    and no clip (each inner update a fresh mask), and no KL term: a bound is not a per-token log-probability that
    the KL's estimate could compare (beta must stay 0)."""

    def validate(self) -> None:
        super().validate()
        require(self.beta == 0.0, f"beta={self.beta}: SPG has no KL term (its bounds are not per-token "
                "log-probabilities); keep beta=0")

    def __call__(self, logp: torch.Tensor, advantages: torch.Tensor, completion: torch.Tensor, group_size: int,
                 old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, Metrics]:
        sequence = (logp * completion.to(logp.dtype)).sum(1)
        loss = -(advantages.detach().to(logp.dtype) * sequence).sum() / completion.sum().clamp(min=1)
        return loss, {"sequence_logp": sequence.detach().mean()}

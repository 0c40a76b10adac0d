"""Policy losses on a batch of rollouts: GRPO's clipped ratio (d1's form) and wd1's ratio-free weighted likelihood.

Each takes the current per-token log-likelihood estimates `logp` [B, L] (differentiable), the advantages [B] of the
G rollouts of each prompt (consecutive rows), the completion mask [B, L], and where it uses them the old policy's
and the reference policy's estimates under the same masks (detached). It returns the loss and what to log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mdmkit.core.config import Validated, require

Metrics = dict[str, torch.Tensor]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of `values` over the positions `mask` holds (0 when it holds none)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def k3_divergence(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference): exp(r - p) - (r - p) - 1, >= 0 and unbiased for samples
    of the policy (Schulman's k3), the form GRPO and d1 penalise."""
    gap = ref_logp - logp
    return torch.exp(gap) - gap - 1.0


@dataclass
class PolicyLoss(Validated):
    """Base: `beta` weighs the KL to the frozen reference model (0: no reference model is kept at all)."""

    beta: float = 0.0
    # whether it compares with the policy that rolled out (a ratio): only then are `old_logp` estimated
    uses_old_policy: ClassVar[bool] = False

    def validate(self) -> None:
        require(self.beta >= 0.0, f"beta={self.beta} must be >= 0")

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor | None, completion: torch.Tensor,
           metrics: Metrics) -> torch.Tensor:
        """beta times the mean per-token KL over the completion (0 without a reference), logged as `kl`."""
        if self.beta == 0.0 or ref_logp is None:
            return logp.new_zeros(())
        divergence = masked_mean(k3_divergence(logp, ref_logp), completion)
        metrics["kl"] = divergence.detach()
        return self.beta * divergence

    def __call__(self, logp: torch.Tensor, advantages: torch.Tensor, completion: torch.Tensor, group_size: int,
                 old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, Metrics]:
        raise NotImplementedError


@dataclass
class GRPOLoss(PolicyLoss):
    """d1's diffu-GRPO: per completion token, -(min(rho A, clip(rho, 1 - clip, 1 + clip) A) - beta KL) with
    rho = exp(logp - old_logp), averaged over every completion token of the batch. Without `old_logp` (one inner
    update: the rollouts' own policy) rho is exp(logp - logp.detach()) = 1, whose gradient is the plain policy
    gradient. `clip_frac` is the share of tokens whose clipped term is the one taken (its gradient is 0)."""

    beta: float = 0.04
    clip: float = 0.2
    uses_old_policy: ClassVar[bool] = True

    def validate(self) -> None:
        super().validate()
        require(0.0 < self.clip < 1.0, f"clip={self.clip} must lie in (0, 1)")

    def __call__(self, logp: torch.Tensor, advantages: torch.Tensor, completion: torch.Tensor, group_size: int,
                 old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, Metrics]:
        completion = completion.to(logp.dtype)
        ratio = torch.exp(logp - (logp.detach() if old_logp is None else old_logp))
        advantage = advantages[:, None].to(logp.dtype)
        unclipped = ratio * advantage
        clipped = ratio.clamp(1.0 - self.clip, 1.0 + self.clip) * advantage
        surrogate = masked_mean(torch.minimum(unclipped, clipped), completion)
        metrics: Metrics = {"clip_frac": masked_mean((clipped < unclipped).to(logp.dtype), completion).detach()}
        loss = -surrogate + self.kl(logp, ref_logp, completion, metrics)
        return loss, metrics


@dataclass
class WD1Loss(PolicyLoss):
    """wd1: no policy ratio, so no old policy's likelihood to estimate. Within each prompt's group, weights
    w+ = softmax(temperature * A) and w- = softmax(-temperature * A); the loss is sum_i (w-_i - w+_i) log pi(o_i)
    over the group (log pi: the sum of the completion's per-token estimates), averaged over the groups, plus beta
    times the KL. The w+ term raises the likelihood of the better rollouts; the w- term (`negative`) lowers that of
    the worse ones. Groups whose rollouts score alike get equal weights, whose terms cancel."""

    temperature: float = 1.0
    negative: bool = True

    def validate(self) -> None:
        super().validate()
        require(self.temperature > 0.0, f"temperature={self.temperature} must be > 0")

    def __call__(self, logp: torch.Tensor, advantages: torch.Tensor, completion: torch.Tensor, group_size: int,
                 old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, Metrics]:
        sequence = (logp * completion.to(logp.dtype)).sum(1).view(-1, group_size)
        scaled = self.temperature * advantages.detach().to(logp.dtype).view(-1, group_size)
        weights = -scaled.softmax(1)
        if self.negative:
            weights = weights + (-scaled).softmax(1)
        metrics: Metrics = {"sequence_logp": sequence.detach().mean()}
        loss = (weights * sequence).sum(1).mean() + self.kl(logp, ref_logp, completion.to(logp.dtype), metrics)
        return loss, metrics

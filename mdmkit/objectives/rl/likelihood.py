"""Per-token log-likelihood estimates of a rollout under a masked diffusion network, for policy gradients.

A masked diffusion network gives p(x_k | a partly masked sequence), not log p(completion | prompt), so an RL
method for it needs an estimate of the latter that it can differentiate. Each estimator here returns one value per
completion position ([B, L], 0 elsewhere) whose sum over the completion estimates (or bounds) the sequence's
log-likelihood. Its masks come from `generator` alone, so the current, old and reference policies scored with
generators in one state see the same noise (the ratio of GRPO compares like with like), and a fresh state per
inner update gives a fresh mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mdmkit.core.config import Validated, require

Network = Callable[[torch.Tensor], torch.Tensor]  # tokens [B, L] -> logits [B, L, V]


def token_log_probs(network: Network, noisy: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[b, k] | noisy[b]) at every position [B, L], from one forward over `noisy` (in float32)."""
    logits = network(noisy).float()
    return logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)


@dataclass
class LikelihoodEstimator(Validated):
    """Base of the estimators: `__call__(network, tokens, completion, mask_id, generator, advantages)` -> [B, L].
    `advantages` [B]: the rollouts', for an estimator that scores the rollouts to raise and those to lower
    differently (SPG's sandwich, sandwich.py); the others ignore them."""

    @property
    def forwards(self) -> int:
        """Forwards of the network per rollout and estimate (what one inner update costs beyond its backward)."""
        return 1

    def __call__(self, network: Network, tokens: torch.Tensor, completion: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class OneStepEstimator(LikelihoodEstimator):
    """d1's one-step estimate: the completion masked whole and each prompt position masked with probability
    `p_mask` (one draw per position: `torch.rand(tokens.shape)`), then log p(o_k | that) for every completion
    position k from one forward. Cheap and biased (it scores every token as if decoded first); the random prompt
    mask, fresh per inner update, is what keeps repeated updates on one batch of rollouts from over-fitting one
    view of it."""

    p_mask: float = 0.15

    def validate(self) -> None:
        require(0.0 <= self.p_mask < 1.0, f"p_mask={self.p_mask} must lie in [0, 1)")

    def __call__(self, network: Network, tokens: torch.Tensor, completion: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
        draws = torch.rand(tokens.shape, generator=generator, device=tokens.device)
        masked = completion | (draws < self.p_mask)
        return token_log_probs(network, torch.where(masked, mask_id, tokens), tokens) * completion


@dataclass
class CoupledEstimator(LikelihoodEstimator):
    """Coupled complementary masks (DiffuCoder's coupled-GRPO): per rollout a rate t ~ U(t_min, t_max) (draw
    `torch.rand(B)`), a mask M hiding each completion position with probability t (`torch.rand(tokens.shape)` < t)
    and its complement M' (the rest of the completion): two forwards in which every completion token is hidden, and
    scored, exactly once. Token k's estimate is half its log-probability under the mask that hid it, divided by
    that mask's rate (t for M, 1 - t for M'): in expectation the mean of its log-probabilities under the two, on
    the scale of the one-step estimate but with context from the rest of the completion. The prompt stays whole."""

    t_min: float = 0.2
    t_max: float = 0.8

    def validate(self) -> None:
        require(0.0 < self.t_min <= self.t_max < 1.0, f"t_min={self.t_min}, t_max={self.t_max}: need 0 < t_min <= "
                "t_max < 1 (both masks must hide something)")

    @property
    def forwards(self) -> int:
        return 2

    def __call__(self, network: Network, tokens: torch.Tensor, completion: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
        rows = tokens.shape[0]
        t = self.t_min + (self.t_max - self.t_min) * torch.rand(rows, generator=generator, device=tokens.device)
        first = completion & (torch.rand(tokens.shape, generator=generator, device=tokens.device) < t[:, None])
        second = completion & ~first
        noisy = torch.cat([torch.where(first, mask_id, tokens), torch.where(second, mask_id, tokens)])
        both = token_log_probs(network, noisy, tokens.repeat(2, 1))
        under_first, under_second = both[:rows] / t[:, None], both[rows:] / (1.0 - t[:, None])
        return 0.5 * torch.where(first, under_first, torch.where(second, under_second, 0.0))


@dataclass
class MonteCarloELBO(LikelihoodEstimator):
    """The masked diffusion ELBO, log p(o | q) >= E_t[(1/t) sum over masked k of log p(o_k | o masked at rate t)],
    estimated with `samples` draws of t: with `antithetic`, half of them u ~ U(0, 1) (`torch.rand(B, K/2)`) and the
    other half 1 - u, which cancels much of the variance from t; t = t_min + (1 - t_min) u. Each draw masks the
    completion independently (`torch.rand(K, B, L)` < t). Token k's estimate is the mean over the draws of
    [k masked] log p / t. An unbiased estimate of the bound (for t_min -> 0), at `samples` forwards."""

    samples: int = 2
    antithetic: bool = True
    t_min: float = 1e-3

    def validate(self) -> None:
        require(self.samples >= 1, f"samples={self.samples} must be >= 1")
        require(not self.antithetic or self.samples % 2 == 0,
                f"samples={self.samples} with antithetic=true: antithetic draws come in pairs (u, 1 - u); use an "
                "even number")
        require(0.0 < self.t_min < 1.0, f"t_min={self.t_min} must lie in (0, 1)")

    @property
    def forwards(self) -> int:
        return self.samples

    def __call__(self, network: Network, tokens: torch.Tensor, completion: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, advantages: torch.Tensor | None = None) -> torch.Tensor:
        rows, k = tokens.shape[0], self.samples
        if self.antithetic:
            u = torch.rand(rows, k // 2, generator=generator, device=tokens.device)
            u = torch.cat([u, 1.0 - u], dim=1)
        else:
            u = torch.rand(rows, k, generator=generator, device=tokens.device)
        t = (self.t_min + (1.0 - self.t_min) * u).T  # [K, B]
        draws = torch.rand((k, *tokens.shape), generator=generator, device=tokens.device)
        masked = completion[None] & (draws < t[..., None])  # [K, B, L]
        noisy = torch.where(masked, mask_id, tokens[None]).flatten(0, 1)
        scores = token_log_probs(network, noisy, tokens.repeat(k, 1)).view(k, *tokens.shape)
        return (torch.where(masked, scores / t[..., None], 0.0)).mean(0)

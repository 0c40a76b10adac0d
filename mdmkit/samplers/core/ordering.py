"""Error proxies: which masked positions to reveal first. Lower error = revealed earlier.

Each maps the per-position predictive distribution (and the chosen token's probability) to a score the loop sorts
by; a learned proxy is any callable with the same signature.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ErrorProxy(Protocol):
    def __call__(
        self, probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """probs [R, L, V], chosen_prob [R, L] -> error [R, L] (lower is revealed first)."""


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each distribution over the last axis; 0 log 0 = 0."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def confidence_error(probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """1 - p(chosen token): at temperature 0 this is 1 - max p."""
    return 1.0 - chosen_prob


def entropy_error(probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return entropy(probs)


def margin_error(probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Minus the gap between the two most likely tokens (top-2 only, never a full-vocabulary sort)."""
    top2 = probs.topk(2, dim=-1).values
    return top2[..., 1] - top2[..., 0]


def entropy_with_eps(eps: float) -> ErrorProxy:
    """The entropy proxy as Dream's sampler computes it: -sum p log(p + eps) (eps > 0), not the exact entropy."""

    def error(probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return -(probs * (probs + eps).log()).sum(-1)

    return error


def random_error(probs: torch.Tensor, chosen_prob: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.rand(chosen_prob.shape, generator=generator, device=chosen_prob.device)


ERROR_PROXIES: dict[str, ErrorProxy] = {
    "confidence": confidence_error,
    "entropy": entropy_error,
    "margin": margin_error,
    "random": random_error,
}

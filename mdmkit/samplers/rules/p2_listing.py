"""P2 as the paper's own PyTorch listing computes it (Peng et al., Appendix E, Listing 1), not as Algorithm 1 states it.

It differs from `P2Sampler` in four places (docs/samplers.md, "Reference checks"): the count is a truncated float32
product; only scores strictly below the count-th lowest are masked (fewer on a tie); at T > 0 x0 and its score come
from Gumbel-perturbed logits; the planner reads the raw proposal. Kept from mdmkit: the mask token is never proposed,
and a count of a whole row masks every non-fixed position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.samplers.rules.p2 import KAPPAS, P2Sampler


@dataclass
class P2ListingSampler(P2Sampler):
    """P2 path planning exactly as the paper's Listing 1 (Appendix E) computes it (see the module)."""

    def masked_count(self, free: torch.Tensor, step: int) -> torch.Tensor:
        kappa = KAPPAS[self.kappa]((step + 1) * (1.0 / self.steps))
        return (free.float() * (1 - kappa)).long()

    def remask(self, score: torch.Tensor, count: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        ranked = score.sort(dim=-1).values
        padded = torch.cat([ranked, ranked.new_full((len(ranked), 1), float("inf"))], dim=-1)
        return score < padded.gather(-1, count[:, None])

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.temperature == 0.0:
            return super().propose(logits, generator)
        uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
        noisy = logits / self.temperature - (-(uniform + 1e-8).log() + 1e-8).log()
        logp, tokens = noisy.log_softmax(-1).max(-1)
        return tokens, logp

    def planner_input(self, state: torch.Tensor, x0: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
        return x0

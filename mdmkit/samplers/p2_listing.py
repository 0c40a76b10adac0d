"""P2 as the paper's own PyTorch listing computes it (Peng et al., Appendix E, Listing 1), not as Algorithm 1 states it.

`P2Sampler` (the `p2` preset) masks exactly floor(n * (1 - kappa(t))) positions per step. The listing differs in
four places, and `P2ListingSampler` (the `p2_listing` preset) does what the listing does:

1. the count is `(n.float() * (1 - kappa(step * (1 / steps)))).long()`: a float32 product truncated, which now
   and then lands one below the exact floor;
2. it masks the positions whose score is strictly below the count-th lowest score (0-based), so on a tie at
   that score it masks fewer positions than the count (near-certain positions, log p = 0.0 in float64, and every
   revealed position at eta = 0 tie);
3. at temperature T > 0 it draws x0 as the argmax of logits / T plus Gumbel noise -log(-log(u + 1e-8) + 1e-8),
   and scores it by the log-softmax of those perturbed logits, not by log p(x0) under softmax(logits / T);
4. its planner reads the raw proposal x0, the given positions included.

What stays mdmkit's: the mask token is left out of the softmax and never proposed (the listing keeps it in), and a
step whose count is every position of a row (the listing would index past the row) masks every non-fixed one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.samplers.p2 import KAPPAS, P2Sampler


@dataclass
class P2ListingSampler(P2Sampler):
    """P2 path planning exactly as the paper's Listing 1 (Appendix E) computes it; see the module docstring."""

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

"""The batched masked-sampling loop: each step, predict every masked position, order them by an error
proxy, and reveal a per-row number of the best ones. Samplers differ only in ordering, budget and choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mdmkit.config import Validated, require
from mdmkit.samplers.counting import ForwardCounter


def choose_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per position (argmax at temperature 0, else a tempered sample) and its probability."""
    if temperature == 0.0:
        probs = logits.softmax(-1)
        confidence, tokens = probs.max(-1)
        return tokens, confidence
    probs = (logits / temperature).softmax(-1)
    flat = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator)
    tokens = flat.view(probs.shape[:-1])
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)


@dataclass
class MaskedSampler(Validated):
    """Base loop. Subclasses set the budget: how many of the best-ordered masked positions to reveal."""

    ordering: Literal["confidence"] = "confidence"
    temperature: float = 0.0

    def validate(self) -> None:
        require(self.temperature >= 0.0, f"temperature={self.temperature} must be >= 0")

    def reveal_counts(self, sorted_scores: torch.Tensor, n_masked: torch.Tensor) -> torch.Tensor:
        """Per-row number of positions to reveal, given scores sorted best first (masked ones only)."""
        raise NotImplementedError

    @torch.no_grad()
    def sample(
        self, network: ForwardCounter, tokens: torch.Tensor, mask_id: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Fill every `mask_id` position of `tokens` [B, L]; the counter records each row's NFE."""
        x = tokens.clone()
        while True:
            masked = x == mask_id
            rows = masked.any(1).nonzero().squeeze(1)
            if rows.numel() == 0:
                return x
            state, row_masked = x[rows], masked[rows]
            logits = network(state, rows).float()
            never_mask = torch.tensor([mask_id], device=logits.device)
            logits = logits.index_fill(-1, never_mask, float("-inf"))  # the mask token is never a prediction
            choice, confidence = choose_tokens(logits, self.temperature, generator)
            score = confidence.masked_fill(~row_masked, float("-inf"))
            sorted_scores, order = score.sort(dim=1, descending=True)
            n_masked = row_masked.sum(1)
            counts = self.reveal_counts(sorted_scores, n_masked).clamp(min=1)
            counts = torch.minimum(counts, n_masked)
            in_budget = torch.arange(x.shape[1], device=x.device)[None, :] < counts[:, None]
            reveal = torch.zeros_like(row_masked).scatter(1, order, in_budget)
            x[rows] = torch.where(reveal, choice, state)


@dataclass
class TopKSampler(MaskedSampler):
    """Reveal the k best positions per step (k = 1 is full-step sampling: one token per forward pass)."""

    k: int = 1

    def validate(self) -> None:
        super().validate()
        require(self.k >= 1, f"k={self.k} must be >= 1")

    def reveal_counts(self, sorted_scores: torch.Tensor, n_masked: torch.Tensor) -> torch.Tensor:
        return torch.full_like(n_masked, self.k)

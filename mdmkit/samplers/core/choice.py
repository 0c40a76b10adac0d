"""Choice: what token to put at a position, given the network's logits there."""

from __future__ import annotations

import torch

from mdmkit.models.denoiser import without_mask


def predictive_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution tokens are drawn from: softmax(logits / T) restricted to the top-p nucleus; at temperature 0
    the untempered softmax (the argmax is taken from it)."""
    if temperature == 0.0:
        return logits.softmax(-1)
    probs = (logits / temperature).softmax(-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the best token)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def choose_tokens(
    probs: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax at temperature 0, else a draw from `probs`; returns tokens and their probabilities."""
    if temperature == 0.0:
        confidence, tokens = probs.max(-1)
        return tokens, confidence
    flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    tokens = flat.view(probs.shape[:-1])
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)


def choose_in_span(logits: torch.Tensor, span: slice, length: int, mask_id: int, temperature: float, top_p: float,
                   generator: torch.Generator | None, dtype: torch.dtype = torch.float32
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their probabilities [R, length] chosen from `logits` [R, S, V], those of the canvas columns
    `span` (in `dtype`, the mask token never chosen); `mask_id` and 0 elsewhere. Samplers pass the columns a step
    may reveal, so the vocabulary-wide work skips the prompt."""
    part = without_mask(logits, mask_id, dtype)
    tokens, confidence = choose_tokens(predictive_distribution(part, temperature, top_p), temperature, generator)
    chosen = torch.full((logits.shape[0], length), mask_id, dtype=tokens.dtype, device=tokens.device)
    probability = torch.zeros(chosen.shape, dtype=confidence.dtype, device=confidence.device)
    chosen[:, span], probability[:, span] = tokens, confidence
    return chosen, probability

"""Indicator labels: roll a reference trajectory back to step t' and mark what the oracle would merge there.

From the state after steps 0..t'-1, the positions of the steps the oracle's trajectory-preserving merge
(`mdmkit.samplers.rules.oracle`) reveals are labelled 1, every other still-masked position 0. Walking these merges from
t' = 0 is exactly `oracle_merge` (tests/test_ni.py checks it).
"""

from __future__ import annotations

import torch

from mdmkit.models.denoiser import HiddenStateDenoiser, without_mask
from mdmkit.models.indicator import Indicator, features

_NEVER = torch.iinfo(torch.long).max


def draw_rollback(steps: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniform rollback step t' in {0, ..., steps - 1} per row [B] (0 for rows without steps)."""
    uniform = torch.rand(steps.shape, generator=generator, device=steps.device, dtype=torch.float64)
    return (uniform * steps).long().clamp(max=(steps - 1).clamp(min=0))


def rollback_state(
    tokens: torch.Tensor, reveal_step: torch.Tensor, done: torch.Tensor, mask_id: int
) -> torch.Tensor:
    """The state [B, L] after the first `done` [B] steps: later steps masked, the rest (givens included) as in
    `tokens`."""
    return torch.where(reveal_step >= done[:, None], mask_id, tokens)


def merge_labels(
    predicted: torch.Tensor,
    tokens: torch.Tensor,
    reveal_step: torch.Tensor,
    done: torch.Tensor,
    n_steps: torch.Tensor,
) -> torch.Tensor:
    """Bool [B, L]: the positions the oracle reveals from the state after `done` steps.

    `predicted` [B, L] is the network's argmax (mask excluded) at that state. Steps `done`..bound-1 merge,
    where bound is the first step after `done` holding a wrong position (the row's step count if none does).
    """
    wrong_later = (predicted != tokens) & (reveal_step > done[:, None])
    bound = torch.minimum(torch.where(wrong_later, reveal_step, _NEVER).amin(1), n_steps)
    return (reveal_step >= done[:, None]) & (reveal_step < bound[:, None])


def labelled_examples(base: HiddenStateDenoiser, indicator: Indicator, trajectories: tuple[torch.Tensor, ...],
                      mask_id: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The indicator's training examples from a batch of trajectories (tokens, reveal_step, steps): its logits
    [N, 2] and the merge labels [N] of the still-masked positions at a random rollback per row. The frozen
    `base` network (capability `hidden_states`) runs without gradients; the loss is their cross-entropy."""
    tokens, reveal_step, steps = trajectories
    done = draw_rollback(steps, generator)
    with torch.no_grad():
        state = rollback_state(tokens, reveal_step, done, mask_id)
        logits, hidden = base.forward_with_hidden(state)
        logits = without_mask(logits, mask_id)
        labels = merge_labels(logits.argmax(-1), tokens, reveal_step, done, steps)
        scored = reveal_step >= done[:, None]
        config = indicator.config
        inputs = features(base.embed, logits[scored], hidden[scored], config.top_tokens, config.top_probs)
    return indicator(inputs), labels[scored].long()

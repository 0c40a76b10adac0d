"""Where a sampler's trajectory first goes wrong: the forward passes it made, and its first wrong reveal per row.

A final accuracy says a completion is wrong, not when it went wrong. Tracing each forward's input tokens (and
the entropies the sampler ranked by) lets an analysis find the step of each row's first wrong reveal, the cells
revealed with it, and the partial answer the model saw there, all of it still right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.samplers import ForwardCounter
from mdmkit.samplers.core.ordering import entropy


@dataclass(frozen=True)
class Forward:
    """One traced forward: the batch rows it ran on, their input tokens and per-position entropies (nats)."""

    rows: torch.Tensor
    tokens: torch.Tensor
    entropies: torch.Tensor


def predictive(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Probabilities as the samplers read logits: in float32, the mask token never a prediction."""
    mask = torch.tensor([mask_id], device=logits.device)
    return logits.float().index_fill(-1, mask, float("-inf")).softmax(-1)


class TracingCounter(ForwardCounter):
    """A forward counter that keeps every forward's rows, input tokens and entropies (on the CPU)."""

    def __init__(self, network: Any, batch_size: int, mask_id: int) -> None:
        super().__init__(network, batch_size)
        self.mask_id = mask_id
        self.trace: list[Forward] = []

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, *, logits_at: slice | None = None,
                 **kwargs: Any) -> torch.Tensor:
        logits = super().__call__(tokens, rows, **kwargs)  # every column's, for the trace
        self.trace.append(Forward(rows.cpu(), tokens.cpu(), entropy(predictive(logits, self.mask_id)).cpu()))
        return logits if logits_at is None else logits[:, logits_at]


@dataclass(frozen=True)
class WrongReveal:
    """A row's first step that revealed a wrong token. `before`: the row's tokens that step saw (every revealed
    token right); `revealed` / `wrong`: boolean masks of the cells that step revealed and of those it got wrong;
    `free_is_wrong`: whether the revealed cell of highest entropy (EB's free token) is among the wrong ones."""

    row: int
    step: int
    before: torch.Tensor
    revealed: torch.Tensor
    wrong: torch.Tensor
    free_is_wrong: bool
    free_entropy: float


def first_wrong_reveals(trace: list[Forward], final: torch.Tensor, target: torch.Tensor,
                        mask_id: int) -> list[WrongReveal]:
    """The first wrong reveal of every row of `final` [B, L] that differs from `target` in a revealed cell, in
    row order. A step's reveals are what the next forward's input (or `final`, after the last) has unmasked."""
    per_row: dict[int, list[Forward]] = {}
    for forward in trace:
        for j, row in enumerate(forward.rows.tolist()):
            per_row.setdefault(row, []).append(Forward(forward.rows[j], forward.tokens[j], forward.entropies[j]))
    found = []
    final, target = final.cpu(), target.cpu()
    for row in sorted(per_row):
        steps = per_row[row]
        states = [step.tokens for step in steps] + [final[row]]
        for index, step in enumerate(steps):
            revealed = (step.tokens == mask_id) & (states[index + 1] != mask_id)
            wrong = revealed & (states[index + 1] != target[row])
            if wrong.any():
                free = torch.where(revealed, step.entropies, float("-inf")).argmax()
                found.append(WrongReveal(row, index, step.tokens, revealed, wrong, bool(wrong[free]),
                                         float(step.entropies[free])))
                break
    return found

"""Block diffusion without a cache, as LLaDA2.x's generate runs it: each forward recomputes a row's window.

A row's window runs from its first real token (absolute position 0) to the end of the block it fills; only the
block's logits are read, and a rule (a masked-loop sampler, or one with token editing) fills the block through a
`CountedNetwork` view of those forwards. No forward commits a block (there is no cache to write), so NFE is the
number of the rule's steps, as the reference counts its forward calls. Rows are independent: each has its own window,
and a batch's shorter windows are padded on the right with keys no query sees.

`attention`:
- `block_causal`: a query sees its own block and every earlier one (blocks from position 0), the pattern the network
  was trained with; a finished block's keys do not depend on what comes after it.
- `reference`: LLaDA2.1's generate passes that pattern as a 0/1 float mask, which SDPA adds to the scores as it is:
  every key of the window is seen, the block-causal ones with +1. So earlier blocks attend to later ones too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from mdmkit.core.stopping import Stop
from mdmkit.samplers.core.counting import CountedNetwork, ForwardCounter
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.protocol import Canvas, Sampled

WindowAttention = Literal["block_causal", "reference"]


class WindowRule(Protocol):
    """The rule that fills one block (a masked-loop sampler, or token editing on one)."""

    @property
    def stop_early(self) -> bool: ...

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled: ...


class WindowSettings(Protocol):
    """What the walk reads of its sampler."""

    @property
    def block_size(self) -> int: ...

    @property
    def attention(self) -> WindowAttention: ...

    @property
    def rule(self) -> WindowRule: ...


def _first(flags: torch.Tensor) -> torch.Tensor:
    """Per row, the first column where `flags` [R, L] holds (L where none does)."""
    columns = torch.arange(flags.shape[1], device=flags.device)
    return torch.where(flags, columns, flags.shape[1]).min(1).values


def window_mask(positions: torch.Tensor, valid: torch.Tensor, block: int, attention: WindowAttention) -> torch.Tensor:
    """The attention mask [R, 1, W, W] of windows whose columns sit at `positions` [W] (from each row's position 0),
    `valid` [R, W] their real columns: bool for `block_causal`, the additive 0/1 float for `reference`; padding keys
    are hidden either way."""
    allowed = (positions[:, None] // block >= positions[None, :] // block)[None]
    keys = valid[:, None, :]
    if attention == "block_causal":
        return (allowed & keys)[:, None]
    return allowed.float().masked_fill(~keys, float("-inf"))[:, None]


def walk_windows(settings: WindowSettings, network: ForwardCounter, canvas: Canvas) -> Sampled:
    """Fill `canvas` block by block (see the module): each running row's rule fills its first block with a mask."""
    batch = Batch(network, canvas, stop_early=settings.rule.stop_early)
    keep = canvas.attention_mask
    length = batch.length
    origin = torch.zeros_like(batch.steps) if keep is None else _first(keep.bool())
    block = settings.block_size
    for step in batch:
        rows = step.rows
        first = _first(batch.answer[rows] & (batch.x[rows] == canvas.mask_id) & ~batch.left[rows])
        start = origin[rows] + (first - origin[rows]) // block * block
        end = (start + block).clamp(max=length)
        columns = start[:, None] + torch.arange(block, device=start.device)
        valid = columns < end[:, None]
        columns = columns.clamp(max=length - 1)
        filler = 1 if canvas.mask_id == 0 else 0  # a given token in slots past the canvas: never revealed
        tokens = torch.where(valid, batch.x[rows[:, None], columns], filler)
        view = _Windows(network, batch.x, rows, origin[rows], start, valid, settings.attention, block)
        stop = None if canvas.stop is None else _WindowStop(canvas.stop, view, batch.answer)
        inner = settings.rule.fill(view, Canvas(tokens, canvas.mask_id, canvas.generator, stop=stop))
        where = rows[:, None].expand_as(columns)
        batch.x[where[valid], columns[valid]] = inner.tokens[valid]
        stepped = valid & (inner.reveal_step >= 0)
        batch.reveal_step[where[stepped], columns[stepped]] = (batch.steps[rows][:, None] + inner.reveal_step)[stepped]
        batch.steps[rows] += inner.steps
        # what the rule left masked (its row stopped) stays so: the walk goes on past it
        left = valid & (inner.tokens == canvas.mask_id)
        batch.left[where[left], columns[left]] = True
        batch.settle(rows)
    return batch.result()


class _Windows:
    """What the rule sees (a `CountedNetwork`): a network over the rows' current blocks, whose forwards run the
    windows from each row's position 0 to its block's end."""

    def __init__(self, network: ForwardCounter, x: torch.Tensor, rows: torch.Tensor, origin: torch.Tensor,
                 start: torch.Tensor, valid: torch.Tensor, attention: WindowAttention, block: int) -> None:
        self.network, self.x, self.rows, self.origin, self.start = network, x, rows, origin, start
        self.valid, self.attention, self.block = valid, attention, block
        self.last_rows = torch.arange(len(rows), device=rows.device)

    def __call__(self, state: torch.Tensor, rows: torch.Tensor, logits_at: slice | None = None,
                 **_: Any) -> torch.Tensor:
        """Logits [R, S, V] of the rule's rows `rows` (indices into this walk's rows) with their blocks in state
        `state` [R, S] (of its columns `logits_at` only, if given)."""
        self.last_rows = rows
        outer, origin = self.rows[rows], self.origin[rows]
        offset = self.start[rows] - origin  # the block's first column in each window
        width = state.shape[1]
        window = int(offset.max()) + width
        columns = torch.arange(window, device=state.device)
        ends = offset + self.valid[rows].long().sum(1)
        real = columns[None, :] < ends[:, None]
        canvas = (origin[:, None] + columns).clamp(max=self.x.shape[1] - 1)
        tokens = torch.where(real, self.x[outer[:, None], canvas], state[:, :1])
        own = offset[:, None] + torch.arange(width, device=state.device)
        tokens.scatter_(1, own, state)
        mask = window_mask(columns, real, self.block, self.attention)
        low, high = int(offset.min()), window
        logits = self.network(tokens, outer, logits_at=slice(low, high), attn_mask=mask,
                              positions=columns[None].expand(len(rows), -1))
        picked = logits.gather(1, (own - low)[:, :, None].expand(-1, -1, logits.shape[-1]))
        return picked if logits_at is None else picked[:, logits_at]

    def mark_stopped(self, rows: torch.Tensor) -> None:
        self.network.mark_stopped(self.rows[rows.to(self.rows.device)])


@dataclass(frozen=True)
class _WindowStop:
    """The canvas's stop condition, read on each row's whole canvas with its block's current state."""

    stop: Stop
    view: _Windows
    answer: torch.Tensor  # [B, L] the whole canvas's positions to fill

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        view = self.view
        inner = view.last_rows  # the rows of the step just taken (the loop settles them after its forward)
        outer = view.rows[inner]
        full = view.x[outer].clone()
        columns = view.start[inner][:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        valid = view.valid[inner]
        where = torch.arange(len(outer), device=outer.device)[:, None].expand_as(columns)
        full[where[valid], columns[valid]] = tokens[valid]
        return self.stop.met(full, self.answer[outer], mask_id)

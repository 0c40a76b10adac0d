"""The batch driver: the row bookkeeping of every step-by-step sampler, kept in one place.

A `fill` walks its batch in steps. Each step runs the rows that still hold a mask (and have neither stopped nor,
with `max_steps`, run out of steps); each row works on its lowest block that holds a mask (blocks: blocks.py). The
driver keeps the canvas, the step that revealed each position, each row's step count and its place in its block;
it runs the step's forward (through the approximate KV cache when the sampler has one, else plainly with the
canvas's padding hidden), writes what the rule reveals and settles the rows that meet the stop condition. What is
left to a sampler is its rule: which positions a step reveals, and with which tokens.

    batch = Batch(network, canvas, stop_early=self.stop_early, block_length=self.block_length)
    for step in batch:
        logits = batch.logits(step, span)
        ...  # the rule: `reveal` [R, L] and `tokens` [R, L]
        batch.reveal(step, reveal, tokens)
        batch.end(step)
    return batch.result()
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.samplers.core.blocks import answer_blocks, enter_blocks
from mdmkit.samplers.core.counting import CountedNetwork, ForwardCounter, whole_counter
from mdmkit.samplers.core.editing import PostSteps
from mdmkit.samplers.core.kv_cache import BlockCache, CacheMode
from mdmkit.samplers.core.protocol import Canvas, Sampled

EVERY = slice(None)  # every column of the canvas


@dataclass(frozen=True)
class Step:
    """One step of the batch rows `rows` (ascending), as it starts."""

    rows: torch.Tensor  # [R]
    state: torch.Tensor  # [R, L] their canvas (a copy)
    masked: torch.Tensor  # [R, L] their masked positions
    in_block: torch.Tensor  # [R, L] the positions of each row's current block
    entered: torch.Tensor  # [R] bool: the row enters that block at this step
    in_block_steps: torch.Tensor  # [R] steps the row has taken in the block before this one
    block_size: torch.Tensor  # [R] masked positions of the block when the row entered it

    @property
    def eligible(self) -> torch.Tensor:
        """[R, L] the masked positions of each row's current block: those a step may reveal."""
        return self.masked & self.in_block


class Batch:
    """The state of one `fill` (see the module): iterate it for the steps, each ended by `end`.

    `blocks` [B, L] numbers each answer position's block (default: `block_length` answer positions a block, in
    reading order); `cache` and `cache_refresh` are the masked loop's approximate KV cache (kv_cache.py), refreshed as
    a row enters a block, and every `cache_refresh` steps inside it when set. `post_steps` (None: decided tokens are
    final) lets the rule rewrite the decided tokens of a row's block, which then takes up to that many steps more
    once full (editing.py): `end` is told whether a step changed any."""

    def __init__(self, network: CountedNetwork, canvas: Canvas, *, stop_early: bool,
                 block_length: int | None = None, blocks: torch.Tensor | None = None, max_steps: int | None = None,
                 cache: CacheMode = "none", cache_refresh: int | None = None, post_steps: int | None = None) -> None:
        self.network, self.canvas, self.stop_early, self.max_steps = network, canvas, stop_early, max_steps
        self.x = canvas.tokens.clone()
        self.answer = self.x == canvas.mask_id
        # masked positions left for good: no step runs for them (a block walk's rule ran out of steps, as
        # LLaDA2.0's generate moves on from a block whose draws left the mask token in it)
        self.left = torch.zeros_like(self.answer)
        batch, self.length = self.x.shape
        device = self.x.device
        self.reveal_step = torch.full_like(self.x, -1)
        self.steps = torch.zeros(batch, dtype=torch.long, device=device)
        self.active = torch.ones(batch, dtype=torch.bool, device=device)  # rows not taken out by a stop
        self.block_of = answer_blocks(self.answer, block_length) if blocks is None else blocks
        self.current_block = torch.full_like(self.steps, -1)
        self.in_block_steps = torch.zeros_like(self.steps)
        self.block_size = torch.zeros_like(self.steps)
        self.cache_refresh = cache_refresh
        self.post = None if post_steps is None else PostSteps(post_steps, batch, device)
        self.cache = None if cache == "none" else BlockCache(cache, whole_counter(network, f"cache={cache}"),
                                                             canvas.attention_mask, self.length)

    def __iter__(self) -> Iterator[Step]:
        while True:
            masked = (self.x == self.canvas.mask_id) & ~self.left
            running = (masked.any(1) if self.post is None else masked.any(1) | self.post.open) & self.active
            if self.max_steps is not None:
                running &= self.steps < self.max_steps
            rows = running.nonzero().squeeze(1)
            if rows.numel() == 0:
                return
            yield self._start(rows, masked[rows])

    def _start(self, rows: torch.Tensor, masked: torch.Tensor) -> Step:
        previous = self.current_block[rows]
        in_block, entered = enter_blocks(masked, self.block_of[rows], self.current_block, rows)
        if self.post is not None:  # a row in its post steps stays in its full block
            in_block, entered = self.post.keep_blocks(rows, in_block, entered, previous, self.block_of[rows],
                                                      self.current_block)
        self.in_block_steps[rows] = torch.where(entered, 0, self.in_block_steps[rows])
        self.block_size[rows] = torch.where(entered, (masked & in_block).sum(1), self.block_size[rows])
        return Step(rows, self.x[rows], masked, in_block, entered, self.in_block_steps[rows], self.block_size[rows])

    def result(self) -> Sampled:
        return Sampled(self.x, self.reveal_step, self.steps)

    def padding(self, rows: torch.Tensor) -> dict[str, Any]:
        """The forward arguments that hide the left padding of `rows` (none without an attention mask)."""
        keep = self.canvas.attention_mask
        return {} if keep is None else {"attn_mask": keep[rows][:, None, None, :]}

    def logits(self, step: Step, span: slice | None) -> torch.Tensor:
        """The step's forward: logits [R, S, V] of the columns `span` (None: every column), through the cache
        (refreshing the rows due) or as one plain forward with the padding hidden."""
        if self.cache is not None:
            refresh = step.entered if self.cache_refresh is None else step.in_block_steps % self.cache_refresh == 0
            columns = slice(0, self.length) if span is None else span
            return self.cache.logits(step.rows, step.state, step.in_block, refresh, columns)
        return self.network(step.state, step.rows, logits_at=span, **self.padding(step.rows))

    def logits_and_hidden(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's forward with its last hidden state (every column; no cache)."""
        counter: ForwardCounter = whole_counter(self.network, "a rule reading hidden states")
        return counter.forward_with_hidden(step.state, step.rows, **self.padding(step.rows))

    def reveal(self, step: Step, reveal: torch.Tensor, tokens: torch.Tensor, span: slice = EVERY) -> None:
        """Reveal `tokens` at the `reveal` positions (both [R, S]: the columns `span`) of the step's rows."""
        self.write(step, torch.where(reveal, tokens, step.state[:, span]), reveal, span)

    def write(self, step: Step, tokens: torch.Tensor, revealed: torch.Tensor, span: slice = EVERY) -> None:
        """The step's rows now hold `tokens` [R, S] at the columns `span` (re-masked positions included); the
        `revealed` ones were revealed by this step."""
        rows = step.rows
        self.x[rows, span] = tokens
        self.reveal_step[rows, span] = torch.where(revealed, self.steps[rows, None], self.reveal_step[rows, span])

    def end(self, step: Step, settled: torch.Tensor | None = None, changed: torch.Tensor | None = None) -> None:
        """Count the step and settle its rows: those whose stop sequence is met in the canvas (or in `settled`
        [B, L], what of it counts as settled) have their NFE noted and, with `stop_early`, stop. With post steps,
        `changed` [R] says which rows' step rewrote a decided token, and a block not yet closed is not settled."""
        rows = step.rows
        self.steps[rows] += 1
        self.in_block_steps[rows] += 1
        if self.post is not None:
            full = ~((self.x[rows] == self.canvas.mask_id) & step.in_block & ~self.left[rows]).any(1)
            edited = torch.zeros_like(full) if changed is None else changed
            closed = self.post.end(rows, step.eligible.any(1), full, edited)
            settled = (self.x if settled is None else settled).clone()
            settled[rows] = settled[rows].masked_fill(step.in_block & ~closed[:, None], self.canvas.mask_id)
        self.settle(rows, settled)

    def settle(self, rows: torch.Tensor, settled: torch.Tensor | None = None) -> None:
        """Settle `rows` (see `end`) after a step counted by the sampler's own walk."""
        stop = self.canvas.stop
        if stop is None:
            return
        canvas = self.x if settled is None else settled
        done = rows[stop.met(canvas[rows], self.answer[rows], self.canvas.mask_id)]
        self.network.mark_stopped(done)
        if self.stop_early:
            self.active[done] = False

"""Dilated unmasking (DUS): a fixed, planner-free order that keeps each step's positions far apart.

Luxembourg, Permuter and Nachmani 2025, arXiv 2506.19037; code: omerlux/DUS (`generate_scheduled` with
scheduler='dilated'). Neighbours depend on each other most, so before any forward each block's offsets are split
into dilated groups (`dilated_groups`), one forward each, whose positions take the chosen token whatever its
confidence. Offsets count a block's answer positions in reading order, so no step is spent on a given.
`defer_below` is the optional skip rule: a position below it waits for the next group, and the block's last group
reveals all that is left, so NFE is always the number of groups. docs/samplers.md ("WINO and dilated unmasking").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.blocks import (
    NO_BLOCK,
    cache_requirements,
    check_cache_fields,
    check_sampling_fields,
    eligible_span,
)
from mdmkit.samplers.core.choice import choose_in_span
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.kv_cache import CacheMode
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler


def dilated_groups(size: int, base: int = 2, base_skip: int = 1) -> list[list[int]]:
    """The offsets 0..size-1 of a block, grouped by the step that reveals them (the code's
    `dilated_unmask_levels` followed by `merge_last_level`).

    The first stride is size // base**base_skip; each later one is the last divided by `base` (integer division),
    down to 1; a stride's group is its multiples not taken by an earlier group. base = 1: one group.
    """
    return [list(group) for group in _groups(size, base, base_skip)]


@lru_cache(maxsize=256)
def _groups(size: int, base: int, base_skip: int) -> tuple[tuple[int, ...], ...]:
    if size <= 0:
        return ()
    if base == 1:
        return (tuple(range(size)),)
    taken = [False] * size
    groups: list[list[int]] = []
    stride = size // base**base_skip
    while stride >= 1:
        group = [offset for offset in range(0, size, stride) if not taken[offset]]
        if group:
            groups.append(group)
            for offset in group:
                taken[offset] = True
        stride //= base
    rest = [offset for offset in range(size) if not taken[offset]]  # only when the first stride is 0
    if rest:
        groups.append(rest)
    if len(groups) >= 2 and len(groups[-1]) < len(groups[-2]):
        groups[-2].extend(groups.pop())
    return tuple(tuple(group) for group in groups)


@dataclass
class DUSSampler(Sampler):
    """Dilated unmasking: every block revealed in its dilated groups, one forward per group (see the module)."""

    base: int = 2  # a: each group's stride is the last one divided by a (1: the whole block in one step)
    base_skip: int = 1  # the first stride is the block size // base**base_skip
    defer_below: float = 0.0  # a scheduled position with confidence below this waits for the next group (0: never)
    temperature: float = 0.0  # 0: argmax; > 0: sample from softmax(logits / T)
    top_p: float = 1.0
    block_length: int | None = None  # semi-autoregressive blocks over the answer positions (None: one block)
    stop_early: bool = True  # with a stop condition: finished rows stop computing (else only the point is noted)
    cache: CacheMode = "none"  # none | prefix | dual: Fast-dLLM's approximate KV caches, refreshed per block
    cache_refresh: int | None = None  # with a cache: also refresh every n steps inside a block (None: never)

    @property
    def requires(self) -> frozenset[str]:
        return cache_requirements(self.cache)

    def validate(self) -> None:
        require(self.base >= 1, f"base={self.base} must be >= 1")
        require(self.base_skip >= 1, f"base_skip={self.base_skip} must be >= 1")
        require(0.0 <= self.defer_below <= 1.0, f"defer_below={self.defer_below} must lie in [0, 1]")
        check_sampling_fields(self.temperature, self.top_p, self.block_length)
        check_cache_fields(self.cache, self.cache_refresh, self.block_length)

    def schedule(self, answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per position of `answer` [B, L] (the positions to fill): its block, its group in that block and the
        block's last group index (-1 and the no-block marker off the answer)."""
        rank = answer.long().cumsum(1) - 1
        count = answer.sum(1, keepdim=True)
        width = count.clamp(min=1) if self.block_length is None else torch.full_like(count, self.block_length)
        block_index = rank.clamp(min=0) // width
        offset = rank.clamp(min=0) % width
        size = torch.minimum(width, count - block_index * width).clamp(min=1)  # the last block may be shorter
        sizes = sorted(set(size[answer].tolist()))
        top = max(sizes, default=1)
        index = torch.zeros(top + 1, top, dtype=torch.long)
        n_groups = torch.zeros(top + 1, dtype=torch.long)
        for each in sizes:
            groups = _groups(each, self.base, self.base_skip)
            for number, members in enumerate(groups):
                index[each, list(members)] = number
            n_groups[each] = len(groups)
        index, n_groups = index.to(answer.device), n_groups.to(answer.device)
        block = torch.where(answer, block_index, NO_BLOCK)
        group = torch.where(answer, index[size, offset.clamp(max=top - 1)], -1)
        last = torch.where(answer, n_groups[size] - 1, -1)
        return block, group, last

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill `canvas` (see `Sampler.sample`): each row's blocks in order, one forward per dilated group."""
        block_of, group_of, last_of = self.schedule(canvas.tokens == canvas.mask_id)
        batch = Batch(network, canvas, stop_early=self.stop_early, blocks=block_of, cache=self.cache,
                      cache_refresh=self.cache_refresh)
        for step in batch:
            rows, stage = step.rows, step.in_block_steps
            if bool((stage > torch.where(step.in_block, last_of[rows], -1).max(1).values).any()):
                raise RuntimeError("internal: a DUS block outlived its last group")
            span = eligible_span(step.eligible)
            choice, confidence = choose_in_span(batch.logits(step, span), span, batch.length, canvas.mask_id,
                                                self.temperature, self.top_p, canvas.generator, torch.float64)
            # this step's group, with the positions deferred from earlier groups of the block
            scheduled = step.eligible & (group_of[rows] <= stage[:, None])
            last_step = stage[:, None] >= last_of[rows]
            batch.reveal(step, scheduled & (last_step | (confidence >= self.defer_below)), choice)
            batch.end(step)
        return batch.result()

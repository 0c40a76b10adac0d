"""The block walk of block diffusion (Fast-dLLM v2): finished blocks in an exact KV cache, sub-blocks filled by a rule.

On a block-causal network (blocks counted from each row's absolute position 0) a finished block never changes: the
forward that commits its clean tokens writes its keys and values once, and predicts the position after them (the
next block's first, revealed there while `commit_reveals`). Inside a block, the rule fills sub-blocks left to right
from forwards over the whole block, seeing them through a `CountedNetwork` view. Rows are independent (own blocks,
cache length, steps). `block_cache` (an approximation) and `prompt_block_unseen` are explained in docs/samplers.md
("Block diffusion"); the sampler and its settings are rules/block_diffusion.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mdmkit.core.errors import CapabilityError
from mdmkit.core.stopping import Stop
from mdmkit.models.denoiser import without_mask
from mdmkit.models.llm.registry import kind_names
from mdmkit.samplers.core.choice import choose_tokens, predictive_distribution
from mdmkit.samplers.core.counting import CountedNetwork, ForwardCounter
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.protocol import Canvas, Sampled


class BlockRule(Protocol):
    """A rule that fills one sub-block (a masked sampler without blocks of its own, LLaDA2.0's rule); its temperature
    and top_p also choose the token a committing forward predicts."""

    temperature: float
    top_p: float
    stop_early: bool

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled: ...


class BlockSettings(Protocol):
    """What the walk reads of its sampler (`BlockDiffusionSampler`'s fields)."""

    block_size: int
    sub_block: int
    block_cache: bool
    prompt_block_unseen: bool
    commit_reveals: bool
    attention_block: int | None
    store_finished: bool

    @property
    def rule(self) -> BlockRule: ...


def walk_blocks(settings: BlockSettings, network: ForwardCounter, canvas: Canvas) -> Sampled:
    """Fill `canvas` block by block (see the module): a row whose block starts past its committed columns commits
    them first (one forward), else its rule fills the block's next sub-block (and, with `store_finished`, a block
    that is now full is committed at once, the last one too, before the stop condition is read)."""
    batch = Batch(network, canvas, stop_early=settings.rule.stop_early)
    decode = _Decode(settings, network, batch)
    for step in batch:
        rows = step.rows
        start = decode.block_start(rows)
        behind = decode.committed[rows] < start
        if bool(behind.any()):
            decode.commit(rows[behind], start[behind])
            rows = rows[behind]
        else:
            decode.fill_sub_blocks(rows, start)
            if settings.store_finished:
                end = (start + settings.block_size).clamp(max=decode.length)
                full = decode.first_open(rows) >= end
                if bool(full.any()):
                    decode.commit(rows[full], end[full])
        batch.settle(rows)
    return batch.result()


class ColumnCache:
    """Keys and values per canvas column of every row [B, H, L, D] per layer, as the network's attention reads them.

    `plan` sets what the next forward does: which batch rows it runs, how many leading columns it reads, which
    columns its tokens' keys and values are written to, and whether it splices (writes first, then attends to the
    columns alone: the sub-block cache) or appends (attends to the columns, then to its own tokens).
    """

    def __init__(self, n_layers: int, batch: int, length: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.batch, self.columns = batch, length
        self.rows = torch.arange(0)
        self.read = 0
        self.target: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch rows, columns) of written slots
        self.write: torch.Tensor | None = None  # bool [R, W]: the slots written
        self.splice = False
        self.every = False  # the forward runs every row (its columns are read as a view)

    @property
    def length(self) -> int:
        """The cached columns the next forward reads (the `KVCache` interface's length)."""
        return self.read

    def plan(self, rows: torch.Tensor, read: int, columns: torch.Tensor | None = None,
             write: torch.Tensor | None = None, splice: bool = False) -> None:
        self.rows, self.read, self.write, self.splice = rows, read, write, splice
        self.every = len(rows) == self.batch  # rows are ascending and distinct
        self.target = None
        if write is not None:
            assert columns is not None, "written slots need their columns"
            self.target = rows[:, None].expand_as(write)[write], columns[write]

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               commit: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [R, H, read (+ W), D] of layer `layer` for this call's `k`, `v` [R, H, W, D], as
        planned (`commit` is the `KVCache` argument; the plan says what is written)."""
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or values is None:
            shape = (self.batch, k.shape[1], self.columns, k.shape[3])
            keys = self.keys[layer] = k.new_zeros(shape)
            values = self.values[layer] = v.new_zeros(shape)
        # read before this call's writes (as a view they show through, in columns its queries never see)
        past = None if self.splice else self._read(keys, values)
        if self.target is not None:
            rows, columns = self.target
            keys[rows, :, columns] = k.transpose(1, 2)[self.write]
            values[rows, :, columns] = v.transpose(1, 2)[self.write]
        if past is None:
            return self._read(keys, values)
        return torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)

    def _read(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.every:
            return keys[:, :, : self.read], values[:, :, : self.read]
        return keys[self.rows, :, : self.read], values[self.rows, :, : self.read]


def _first(flags: torch.Tensor) -> torch.Tensor:
    """Per row, the first column where `flags` [R, L] holds (L where none does)."""
    columns = torch.arange(flags.shape[1], device=flags.device)
    return torch.where(flags, columns, flags.shape[1]).min(1).values


def _window(start: torch.Tensor, width: int, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns [R, W] from `start` (W = width, at least 2, so no one-query mask reads as key padding) and which of
    them lie before `end` (the rest are query-only padding slots, seen by none and written nowhere)."""
    offsets = torch.arange(max(width, 2), device=start.device)
    columns = start[:, None] + offsets
    return columns, columns < end[:, None]


class _Decode:
    """The state of one walk: the batch (canvas, steps), each row's origin (absolute position 0) and committed
    columns, the cache."""

    def __init__(self, sampler: BlockSettings, network: ForwardCounter, batch: Batch) -> None:
        canvas = batch.canvas
        self.sampler, self.network, self.canvas = sampler, network, canvas
        self.x, self.answer, self.reveal_step, self.steps = batch.x, batch.answer, batch.reveal_step, batch.steps
        self.left = batch.left
        batch_size, self.length = self.x.shape
        device = self.x.device
        keep = canvas.attention_mask
        self.origin = torch.zeros(batch_size, dtype=torch.long, device=device) if keep is None else _first(keep.bool())
        if sampler.prompt_block_unseen:
            prompt = _first(self.answer) - self.origin
            self.origin = torch.where(prompt == sampler.block_size, self.origin + sampler.block_size, self.origin)
        self.committed = self.origin.clone()  # columns [origin, committed) are in the cache
        self.block_kept = torch.full_like(self.origin, -1)  # with block_cache: the block start whose entries are kept
        self.cache = ColumnCache(network.n_layers, batch_size, self.length)
        self.columns = torch.arange(self.length, device=device)

    def first_open(self, rows: torch.Tensor) -> torch.Tensor:
        """Each row's first masked answer position that is still to be filled (one a rule left masked is not)."""
        return _first(self.answer[rows] & (self.x[rows] == self.canvas.mask_id) & ~self.left[rows])

    def block_start(self, rows: torch.Tensor) -> torch.Tensor:
        """The first column of the block of each row's first masked position."""
        first = self.first_open(rows)
        origin = self.origin[rows]
        return origin + (first - origin) // self.sampler.block_size * self.sampler.block_size

    def forward(self, rows: torch.Tensor, columns: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor,
                visible_before: torch.Tensor, own: torch.Tensor | None, write: torch.Tensor | None = None,
                splice: bool = False) -> torch.Tensor:
        """One forward of `tokens` [R, W] at canvas `columns` through the counter: cached columns
        [origin, visible_before) are seen, and among this call's slots what `own` [R, W, W] allows (None, with
        `splice`: the cached columns only, this call's written there first)."""
        origin = self.origin[rows]
        read = int(visible_before.max())
        cached = self.columns[:read]
        seen = (cached[None, :] >= origin[:, None]) & (cached[None, :] < visible_before[:, None])
        width = columns.shape[1]
        mask = seen[:, None, :].expand(-1, width, -1)
        if own is not None:
            mask = torch.cat([mask, own], 2)
        positions = (columns - origin[:, None]).clamp(min=0)
        self.cache.plan(rows, read, columns, write, splice)
        return self.network(tokens, rows, attn_mask=mask[:, None], positions=positions, cache=self.cache)

    def commit(self, rows: torch.Tensor, start: torch.Tensor) -> None:
        """Write the clean columns [committed, start) of `rows` to the cache, with one query slot at `start`
        whose logits (the model's prediction of that position) reveal it where it is masked."""
        committed, block = self.committed[rows], self.sampler.block_size
        columns, valid = _window(committed, int((start - committed).max()) + 1, start)
        columns = columns.clamp(max=self.length - 1)  # the query slot at `start` is a canvas column
        tokens = self.x[rows[:, None], columns]
        position = columns - self.origin[rows][:, None]
        own = (position[:, :, None] // block >= position[:, None, :] // block) & valid[:, None, :]
        own |= torch.eye(columns.shape[1], dtype=torch.bool, device=columns.device)[None]
        logits = self.forward(rows, columns, valid, tokens, committed, own, write=valid)
        self.committed[rows] = start
        if self.sampler.commit_reveals:
            predicted = logits[torch.arange(len(rows), device=rows.device), start - committed]
            masked = self.x[rows, start] == self.canvas.mask_id
            rule = self.sampler.rule
            probs = predictive_distribution(without_mask(predicted[:, None], self.canvas.mask_id), rule.temperature,
                                            rule.top_p)
            token, _ = choose_tokens(probs, rule.temperature, self.canvas.generator)
            revealed = rows[masked]
            self.x[revealed, start[masked]] = token[masked, 0]
            self.reveal_step[revealed, start[masked]] = self.steps[revealed]
        self.steps[rows] += 1

    def fill_sub_blocks(self, rows: torch.Tensor, start: torch.Tensor) -> None:
        """Fill the sub-block of each row's first masked position with the rule (its forwards run the block)."""
        sub = self.sampler.sub_block
        first = self.first_open(rows)
        sub_start = start + (first - start) // sub * sub
        block_end = (start + self.sampler.block_size).clamp(max=self.length)
        columns, valid = _window(sub_start, sub, torch.minimum(sub_start + sub, block_end))
        columns, valid = columns[:, :sub], valid[:, :sub]
        filler = 1 if self.canvas.mask_id == 0 else 0  # a given token in padding slots: never revealed
        tokens = torch.where(valid, self.x[rows[:, None], columns.clamp(max=self.length - 1)], filler)
        blocks = _SubBlocks(self, rows, start, block_end, columns, valid)
        stop = None if self.canvas.stop is None else _SubBlockStop(self.canvas.stop, blocks)
        inner = self.sampler.rule.fill(blocks, Canvas(tokens, self.canvas.mask_id, self.canvas.generator, stop=stop,
                                                      row_generators=self.canvas.generators_of(rows)))
        filled = valid & (inner.reveal_step >= 0)
        where = rows[:, None].expand_as(columns)
        self.x[where[filled], columns[filled]] = inner.tokens[filled]
        self.reveal_step[where[filled], columns[filled]] = (self.steps[rows][:, None] + inner.reveal_step)[filled]
        self.steps[rows] += inner.steps
        # what the rule left masked (out of steps, or its row stopped) stays so: the walk goes on past it
        left = valid & (inner.tokens == self.canvas.mask_id)
        self.left[where[left], columns[left]] = True


class _SubBlocks:
    """What the rule sees (a `CountedNetwork`): a network over the rows' current sub-blocks, whose forwards run
    their whole blocks."""

    def __init__(self, decode: _Decode, rows: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                 columns: torch.Tensor, valid: torch.Tensor) -> None:
        self.decode, self.rows, self.start, self.end = decode, rows, start, end
        self.sub_columns, self.sub_valid = columns, valid
        self.last_rows = torch.arange(len(rows), device=rows.device)

    def __call__(self, state: torch.Tensor, rows: torch.Tensor, logits_at: slice | None = None,
                 **_: Any) -> torch.Tensor:
        """Logits [R, S, V] of the rule's rows `rows` (indices into this sub-block batch) in state `state` (of its
        columns `logits_at` only, if given)."""
        logits = self._logits(state, rows)
        return logits if logits_at is None else logits[:, logits_at]

    def _logits(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        self.last_rows = rows
        decode = self.decode
        if not decode.sampler.block_cache:
            return self._block(state, rows)
        # the whole block runs on a block's first step and while the sub-block's first position is masked
        whole = (decode.block_kept[self.rows[rows]] != self.start[rows]) | (state[:, 0] == decode.canvas.mask_id)
        if bool(whole.all()) or not bool(whole.any()):
            return self._block(state, rows) if bool(whole.all()) else self._sub_block(state, rows)
        block, sub = self._block(state[whole], rows[whole]), self._sub_block(state[~whole], rows[~whole])
        logits = block.new_empty(len(rows), *block.shape[1:])
        logits[whole], logits[~whole] = block, sub
        return logits

    def _block(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """A forward over the whole block (its current sub-block's state `state`) against the exact cache."""
        decode, outer = self.decode, self.rows[rows]
        start, end = self.start[rows], self.end[rows]
        columns, valid = _window(start, decode.sampler.block_size, end)
        columns = columns.clamp(max=decode.length - 1)
        tokens = decode.x[outer[:, None], columns]
        offset = self.sub_columns[rows] - start[:, None]  # the sub-block's slots in the block (always inside it)
        tokens.scatter_(1, offset, state)
        own = valid[:, None, :].expand(-1, columns.shape[1], -1)
        group = decode.sampler.attention_block
        if group is not None:  # block-causal in groups of `group` positions from the origin, as the prefix is
            position = columns - decode.origin[outer][:, None]
            own = own & (position[:, :, None] // group >= position[:, None, :] // group)
        own = own | torch.eye(columns.shape[1], dtype=torch.bool, device=columns.device)[None]
        keep = valid if decode.sampler.block_cache else None
        logits = decode.forward(outer, columns, valid, tokens, start, own, write=keep)
        if keep is not None:
            decode.block_kept[outer] = start
        return logits.gather(1, offset[:, :, None].expand(-1, -1, logits.shape[-1]))

    def _sub_block(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """A forward over the sub-block only, against the prefix and the kept block entries (an approximation)."""
        decode, outer = self.decode, self.rows[rows]
        columns, valid = self.sub_columns[rows], self.sub_valid[rows]
        if columns.shape[1] < 2:  # a query-only slot, so no one-query mask reads as key padding
            columns, valid = _window(columns[:, 0], 2, columns[:, 0] + valid.long().sum(1))
            state = torch.cat([state, state[:, :1]], 1)
        logits = decode.forward(outer, columns.clamp(max=decode.length - 1), valid, state, self.end[rows], None,
                                write=valid, splice=True)
        return logits[:, : self.sub_columns.shape[1]]

    def mark_stopped(self, rows: torch.Tensor) -> None:
        self.decode.network.mark_stopped(self.rows[rows.to(self.rows.device)])


@dataclass(frozen=True)
class _SubBlockStop:
    """The canvas's stop condition, read on each row's whole canvas with its sub-block's current state."""

    stop: Stop
    blocks: _SubBlocks

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        blocks, decode = self.blocks, self.blocks.decode
        inner = blocks.last_rows  # the rows of the step just taken (the loop settles them after its forward)
        outer = blocks.rows[inner]
        full = decode.x[outer].clone()
        columns, valid = blocks.sub_columns[inner], blocks.sub_valid[inner]
        where = torch.arange(len(outer), device=outer.device)[:, None].expand_as(columns)
        full[where[valid], columns[valid]] = tokens[valid]
        return self.stop.met(full, decode.answer[outer], mask_id)


def require_block_causal(network: ForwardCounter, decoder: str, instead: str) -> None:
    """One line for a block decoder handed a network that attends bidirectionally: the kinds it decodes, and the
    sampler (`instead`) that decodes this one."""
    if not network.block_causal:
        kinds = " | ".join(kind_names(lambda kind: kind.attention == "block_causal"))
        raise CapabilityError(f"{decoder} decodes block-causal networks (hf.kind={kinds}); this one attends "
                              f"bidirectionally: decode it with a masked sampler (e.g. sampler={instead})")

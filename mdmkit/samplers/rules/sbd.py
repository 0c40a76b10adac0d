"""Decoding causal networks with an exact KV cache: next-token prediction and Set Block Decoding.

Both fill each row's answer suffix (the canvas is prompt + masks); docs/samplers.md ("Causal decoders") has the
details. A block's first forward also appends the keys and values of the tokens committed since the last cache
write, so the cache holds only clean tokens, exactly as a full recompute (`use_cache=False`, for the tests) sees
them. Rows of different prompt lengths batch together: shorter rows' cache entries are padding behind a key mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mdmkit.core.config import require
from mdmkit.core.errors import CapabilityError
from mdmkit.core.stopping import Stop
from mdmkit.models.denoiser import KV_CACHE, KVCache
from mdmkit.samplers.core.choice import choose_tokens, predictive_distribution
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.eb import EBSampler

_FILLER = 0  # token id placed in padding slots; they are never attended to and never revealed


def prompt_lengths(tokens: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Leading non-mask tokens per row; refuses canvases whose masks are not exactly a suffix."""
    answer = tokens == mask_id
    lengths = (~answer).long().cumprod(1).sum(1)
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    if not torch.equal(answer, columns[None, :] >= lengths[:, None]):
        raise CapabilityError("causal decoding fills a suffix: every row must be prompt tokens followed only by "
                              "masks (infilling tasks such as Sudoku need a masked diffusion sampler)")
    if bool((lengths == 0).any()):
        raise ValueError("causal decoding needs at least one prompt token per row")
    return lengths


def _pad_right(rows: list[torch.Tensor], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), fill, dtype=torch.long, device=rows[0].device)
    valid = torch.zeros((len(rows), width), dtype=torch.bool, device=rows[0].device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
        valid[i, : len(row)] = True
    return out, valid


class _CausalDecodeState:
    """The per-row bookkeeping shared by both decoders: canvas, cursor, what is cached, the KV cache."""

    def __init__(self, counter: ForwardCounter, tokens: torch.Tensor, mask_id: int, use_cache: bool) -> None:
        self.counter, self.x, self.mask_id, self.use_cache = counter, tokens.clone(), mask_id, use_cache
        self.length = tokens.shape[1]
        self.answer = tokens == mask_id
        self.reveal_step = torch.full_like(tokens, -1)
        self.steps = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        self.cursor = prompt_lengths(tokens, mask_id)  # next position to generate
        self.cached = torch.zeros_like(self.cursor)  # positions [0, cached) are in the KV cache
        self.n_layers = counter.n_layers
        self.cache: KVCache | None = None
        self.cache_rows = torch.arange(0)  # batch rows of the cache, in order
        self.cache_valid = torch.zeros(0, 0, dtype=torch.bool, device=tokens.device)

    def result(self) -> Sampled:
        return Sampled(self.x, self.reveal_step, self.steps)

    def keep_cache_rows(self, rows: torch.Tensor) -> None:
        """Shrink the cache to `rows` (finished rows leave the batch)."""
        if self.cache is None or torch.equal(rows.cpu(), self.cache_rows):
            return
        index = torch.searchsorted(self.cache_rows.to(rows.device), rows)
        self.cache = self.cache.select(index)
        self.cache_valid = self.cache_valid[index]
        self.cache_rows = rows.cpu()

    def forward(self, rows: torch.Tensor, block: torch.Tensor | None, block_valid: torch.Tensor | None,
                commit: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run `rows`: uncached clean tokens (committed if `commit`), then an optional block of queries.

        Returns the logits of the clean part [R, P, V] (with its validity [R, P]) and of the block [R, k, V].
        """
        device = self.x.device
        # the clean tokens this pass runs: none (cached, nothing new), the uncached ones, or all (no cache)
        start = self.cached[rows] if self.use_cache else torch.zeros_like(rows)
        end = self.cursor[rows] if (commit or not self.use_cache) else start
        clean_ids, clean_valid = _pad_right([self.x[r, s:e] for r, s, e in
                                             zip(rows.tolist(), start.tolist(), end.tolist())], _FILLER)
        if not bool(clean_valid.any()):
            clean_ids, clean_valid = clean_ids[:, :0], clean_valid[:, :0]
        last = self.length - 1
        clean_pos = (start[:, None] + torch.arange(clean_ids.shape[1], device=device)).clamp(max=last)
        parts, valid, pos = [clean_ids], [clean_valid], [clean_pos]
        if block is not None:
            assert block_valid is not None, "a block comes with its validity"
            offsets = torch.arange(block.shape[1], device=device)
            block_pos = (self.cursor[rows][:, None] + offsets).clamp(max=last)
            parts.append(block)
            valid.append(block_valid)
            pos.append(block_pos)
        ids, new_valid, positions = torch.cat(parts, 1), torch.cat(valid, 1), torch.cat(pos, 1)
        n_clean, n_new = clean_ids.shape[1], ids.shape[1]

        # queries: clean tokens causally, block tokens see every clean token and the whole block
        query_index = torch.arange(n_new, device=device)
        allowed = query_index[None, :] <= query_index[:, None]
        allowed[n_clean:, :] = True
        allowed = allowed[None] & new_valid[:, None, :]
        allowed |= torch.eye(n_new, dtype=torch.bool, device=device)[None]  # padding attends to itself
        cache = None
        if self.use_cache and self.cache is not None:
            index = torch.searchsorted(self.cache_rows.to(device), rows)
            allowed = torch.cat([self.cache_valid[index][:, None, :].expand(-1, n_new, -1), allowed], 2)
            cache = self.cache if torch.equal(rows.cpu(), self.cache_rows) else self.cache.select(index)
        if self.use_cache and commit:
            if self.cache is None:
                self.cache, self.cache_rows = KVCache.empty(self.n_layers), rows.cpu()
                self.cache_valid = torch.zeros(len(rows), 0, dtype=torch.bool, device=device)
                cache = self.cache
            require(cache is self.cache, "internal: a committing forward must run every cached row")
        logits = self.counter(ids, rows, attn_mask=allowed[:, None], positions=positions, cache=cache,
                              commit=n_clean if (self.use_cache and commit) else 0)
        if self.use_cache and commit:
            self.cache_valid = torch.cat([self.cache_valid, clean_valid], 1)
            self.cached[rows] = self.cursor[rows]
        return logits[:, :n_clean], clean_valid, logits[:, n_clean:]


@dataclass
class NTPDecoder(Sampler):
    """Next-token prediction with a KV cache: one forward, one token (the baseline of SBD)."""

    temperature: float = 0.0
    top_p: float = 1.0
    use_cache: bool = True

    requires: ClassVar[frozenset[str]] = frozenset({KV_CACHE})

    def validate(self) -> None:
        require(self.temperature >= 0, f"temperature={self.temperature} must be >= 0")
        require(0 < self.top_p <= 1, f"top_p={self.top_p} must be in (0, 1]")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        tokens, mask_id, generator, stop = canvas.tokens, canvas.mask_id, canvas.generator, canvas.stop
        _refuse_padding(canvas.attention_mask)
        state = _CausalDecodeState(network, tokens, mask_id, self.use_cache)
        while True:
            rows = _decoding_rows(state, stop, network)
            if rows.numel() == 0:
                return state.result()
            state.keep_cache_rows(rows)
            clean_logits, clean_valid, _ = state.forward(rows, None, None, commit=True)
            last = clean_valid.long().sum(1) - 1
            logits = clean_logits[torch.arange(len(rows)), last].float()
            if mask_id < logits.shape[-1]:  # NTP never feeds a mask: it may be an id past the vocabulary
                logits[:, mask_id] = float("-inf")
            probs = predictive_distribution(logits[:, None], self.temperature, self.top_p)
            token, _ = choose_tokens(probs, self.temperature, generator)
            state.x[rows, state.cursor[rows]] = token[:, 0]
            state.reveal_step[rows, state.cursor[rows]] = state.steps[rows]
            state.cursor[rows] += 1
            state.steps[rows] += 1


def _refuse_padding(attention_mask: torch.Tensor | None) -> None:
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("causal decoding takes left-aligned prompts (prompt then masks), not a padding mask")


def _decoding_rows(state: _CausalDecodeState, stop: Stop | None,
                   counter: ForwardCounter) -> torch.Tensor:
    """Rows with positions left to fill and no stop sequence yet (stopped rows get their NFE noted)."""
    open_rows = state.cursor < state.length
    if stop is not None:
        met = stop.met(state.x, state.answer, state.mask_id)
        counter.mark_stopped(met.nonzero().squeeze(1))
        open_rows &= ~met
    return open_rows.nonzero().squeeze(1)


class _BlockNetwork:
    """What the inner masked sampler sees (a `CountedNetwork`): a network over the current blocks of the decoding
    rows."""

    def __init__(self, state: _CausalDecodeState, rows: torch.Tensor, valid: torch.Tensor) -> None:
        self.state, self.rows, self.valid, self.first = state, rows, valid, True

    def __call__(self, block: torch.Tensor, rows: torch.Tensor, logits_at: slice | None = None,
                 **_: object) -> torch.Tensor:
        outer = self.rows[rows]
        if self.first:  # the block's first pass also writes the clean tokens committed since the last one
            require(len(rows) == len(self.rows), "internal: the first pass of a block runs every row")
        logits = self.state.forward(outer, block, self.valid[rows], commit=self.first)[2]  # the block's
        self.first = False
        return logits if logits_at is None else logits[:, logits_at]

    def mark_stopped(self, rows: torch.Tensor) -> None:
        self.state.counter.mark_stopped(self.rows[rows.to(self.rows.device)])


@dataclass
class SBDSampler(Sampler):
    """Set Block Decoding: blocks of `block_size` masks, revealed by `rule` (any masked sampler's budget).

    `block_size=1` with `rule` top-1 decodes one masked token per forward (not the NTP head: see NTPDecoder).
    """

    block_size: int = 16
    rule: MaskedSampler = field(default_factory=lambda: EBSampler(gamma=0.1, ordering="entropy"))
    use_cache: bool = True

    requires: ClassVar[frozenset[str]] = frozenset({KV_CACHE})

    def validate(self) -> None:
        require(self.block_size >= 1, f"block_size={self.block_size} must be >= 1")
        require(isinstance(self.rule, MaskedSampler), "rule must be a masked sampler (e.g. EBSampler)")
        require(self.rule.block_length is None, "rule.block_length must be null: SBD blocks are block_size")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        tokens, mask_id, generator, stop = canvas.tokens, canvas.mask_id, canvas.generator, canvas.stop
        _refuse_padding(canvas.attention_mask)
        state = _CausalDecodeState(network, tokens, mask_id, self.use_cache)
        offsets = torch.arange(self.block_size, device=tokens.device)
        while True:
            rows = _decoding_rows(state, stop, network)
            if rows.numel() == 0:
                return state.result()
            state.keep_cache_rows(rows)
            where = state.cursor[rows][:, None] + offsets
            valid = where < state.length
            block = torch.where(valid, mask_id, _FILLER)
            inner = self.rule.fill(_BlockNetwork(state, rows, valid), Canvas(block, mask_id, generator, stop=stop))
            filled = valid & (inner.tokens != mask_id)
            row_index = rows[:, None].expand_as(where)
            state.x[row_index[filled], where[filled]] = inner.tokens[filled]
            state.reveal_step[row_index[filled], where[filled]] = (state.steps[rows][:, None]
                                                                   + inner.reveal_step)[filled]
            state.steps[rows] += inner.steps
            unfilled = valid & (inner.tokens == mask_id)  # only after a stop inside the block
            following = torch.where(unfilled, where, where[:, -1:] + 1).min(1).values
            state.cursor[rows] = following.clamp(max=state.length)

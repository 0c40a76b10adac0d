"""Approximate KV caches for masked diffusion in semi-autoregressive blocks (Fast-dLLM's prefix and dual caches).

At a block's first step (and every `cache_refresh` steps) a row runs the plain forward, which writes its keys and
values at all L positions; its other steps run only a query window (`prefix`: the block and what follows it; `dual`:
the block) against cached entries that go stale meanwhile (docs/samplers.md, "KV caches for masked diffusion").
Rows reach blocks at different steps, so each step refreshes some rows and queries the others, one forward each;
`attn_mask` decides per row which cached entries a query sees (left of its block, or outside it; never left
padding), and shorter windows are padded with query-only slots that no token sees. A network whose logits at i come
from its output at i - 1 (Dream) starts its window one position early. Where every row queries one unpadded window,
it writes its entries in place and attends to the whole cache without a mask (`CacheWindow`, the fused kernels).
"""

from __future__ import annotations

from typing import Literal

import torch

from mdmkit.core.config import require
from mdmkit.models.denoiser import CacheWindow, KVCache, positions_from
from mdmkit.samplers.core.counting import ForwardCounter

CacheMode = Literal["none", "prefix", "dual"]


def block_spans(in_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `in_block` [R, L] (the positions of the row's current block): the first position and one past
    the last one."""
    length = in_block.shape[1]
    columns = torch.arange(length, device=in_block.device)
    start = torch.where(in_block, columns, length).min(1).values
    end = torch.where(in_block, columns, -1).max(1).values + 1
    return start, end


class BlockCache:
    """The cache of one `fill` call: `logits` runs each step's forward for the loop's rows (see the module)."""

    def __init__(self, mode: CacheMode, network: ForwardCounter, attention_mask: torch.Tensor | None,
                 length: int) -> None:
        require(mode in ("prefix", "dual"), f"internal: no block cache for cache={mode}")
        require(not network.block_causal, f"cache={mode} approximates a bidirectional network; this one is "
                                          "block-causal: decode it with sampler=block_diffusion (an exact cache)")
        self.mode, self.network, self.keep, self.length = mode, network, attention_mask, length
        self.n_layers = network.n_layers
        self.shifted = network.shifted_logits
        self.store: KVCache | None = None
        self.store_rows: torch.Tensor | None = None  # the batch rows of `store`, ascending

    def logits(self, rows: torch.Tensor, state: torch.Tensor, in_block: torch.Tensor, refresh: torch.Tensor,
               span: slice) -> torch.Tensor:
        """Logits [R, S, V] of the columns `span` of `state` [R, L] (batch rows `rows`, ascending; `span` holds
        every position a step may reveal, all inside the rows' blocks `in_block` [R, L]): full forwards that
        rewrite the cache for the `refresh` rows, query forwards on the cache over their block for the others."""
        self._keep_rows(rows)
        refreshing = int(refresh.sum())
        if refreshing == len(rows):
            return self._refresh(rows, state, span)
        require(self.store is not None, "internal: the first forward refreshes every row")
        start, end = block_spans(in_block)
        if self.shifted:  # the block's first logits are the output one position left of it (see the module)
            start = (start - 1).clamp(min=0)
        if self.mode == "prefix":
            end = torch.full_like(end, self.length)
        if refreshing == 0:
            return self._query(rows, state, start, end, span)
        fresh, cached = refresh.nonzero().squeeze(1), (~refresh).nonzero().squeeze(1)
        refreshed = self._refresh(rows[fresh], state[fresh], span)
        queried = self._query(rows[cached], state[cached], start[cached], end[cached], span)
        logits = refreshed.new_empty(len(rows), *refreshed.shape[1:])
        logits[fresh], logits[cached] = refreshed, queried
        return logits

    def _keep_rows(self, rows: torch.Tensor) -> None:
        """Drop the cache rows of finished rows (rows only ever leave the loop, so equal counts are equal rows)."""
        if self.store_rows is None or len(rows) == len(self.store_rows):
            return
        self.store = self._cache_of(rows)
        self.store_rows = rows

    def _cache_of(self, rows: torch.Tensor) -> KVCache:
        """The cache of `rows` (the store itself where they are all its rows, else a copy)."""
        store, store_rows = self.store, self.store_rows
        assert store is not None and store_rows is not None, "a row was never refreshed"
        if len(rows) == len(store_rows):
            return store
        return store.select(torch.searchsorted(store_rows, rows))

    def _positions(self, rows: torch.Tensor) -> torch.Tensor:
        if self.keep is None:
            return torch.arange(self.length, device=rows.device).expand(len(rows), -1)
        return positions_from(self.keep[rows])

    def _refresh(self, rows: torch.Tensor, state: torch.Tensor, span: slice) -> torch.Tensor:
        """The plain forward of `rows`, writing the keys and values of all their positions to the cache (in place
        where the cache holds exactly these rows: its buffers are allocated once per `fill`)."""
        attn_mask = None if self.keep is None else self.keep[rows][:, None, None, :]
        positions = self._positions(rows)
        if self.store is not None and self.store_rows is not None and len(rows) == len(self.store_rows):
            return self.network(state, rows, attn_mask=attn_mask, positions=positions,
                                cache=CacheWindow(self.store, at=0), commit=self.length, logits_at=span)
        written = KVCache.empty(self.n_layers)
        logits = self.network(state, rows, attn_mask=attn_mask, positions=positions, cache=written,
                              commit=self.length, logits_at=span)
        keys = [k.contiguous() for k in written.keys if k is not None]
        values = [v.contiguous() for v in written.values if v is not None]
        assert len(keys) == len(values) == self.n_layers, "a committing forward writes every layer"
        if self.store is None or self.store_rows is None:
            self.store, self.store_rows = KVCache([*keys], [*values]), rows
            return logits
        index = torch.searchsorted(self.store_rows, rows)
        for stored, new in zip([*self.store.keys, *self.store.values], [*keys, *values], strict=True):
            assert stored is not None, "the store holds every layer"
            stored[index] = new
        return logits

    def _query(self, rows: torch.Tensor, state: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
               span: slice) -> torch.Tensor:
        """Positions [start, end) of each row as queries against its cached entries outside them; the logits of
        the columns `span` (inside every row's window)."""
        first, last, stop, widest = torch.stack([start.min(), start.max(), end.min(), (end - start).max()]).tolist()
        if first == last and stop == first + widest and self.keep is None and first <= span.start <= span.stop <= stop:
            # one window for every row and no padding: its entries replaced in place, attention without a mask
            window = CacheWindow(self._cache_of(rows), at=first)
            return self.network(state[:, first: first + widest], rows, positions=self._positions(rows)[:, first:stop],
                                cache=window, logits_at=slice(span.start - first, span.stop - first))
        length, device = self.length, state.device
        offsets = torch.arange(widest, device=device)
        where = start[:, None] + offsets
        valid = where < end[:, None]  # slots past a row's end are padding: query only, seen by none
        where = where.clamp(max=length - 1)
        columns = torch.arange(length, device=device)
        visible = columns[None, :] < start[:, None]
        if self.mode == "dual":
            visible |= columns[None, :] >= end[:, None]
        if self.keep is not None:
            visible &= self.keep[rows]
        own = valid[:, None, :] | torch.eye(widest, dtype=torch.bool, device=device)[None]
        attn_mask = torch.cat([visible[:, None, :].expand(-1, widest, -1), own], 2)[:, None]
        queried = self.network(state.gather(1, where), rows, attn_mask=attn_mask,
                               positions=self._positions(rows).gather(1, where), cache=self._cache_of(rows))
        # onto the span's columns: padding slots and columns outside the span go to a spare column, cut off
        width = span.stop - span.start
        target = torch.where(valid & (where >= span.start) & (where < span.stop), where - span.start, width)
        placed = queried.new_zeros(len(rows), width + 1, queried.shape[-1])
        placed.scatter_(1, target[:, :, None].expand(-1, -1, queried.shape[-1]), queried)
        return placed[:, :width]

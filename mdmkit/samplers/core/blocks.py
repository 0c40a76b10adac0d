"""Semi-autoregressive blocks and what block-wise samplers share (masked loop, DUS, WINO, slow-fast): the
sampling fields' checks and picking the best positions of a block.

Blocks are taken over the answer positions (the masks) in reading order, so givens between blanks never form
blocks of their own. A row works on its lowest block that still holds a mask.
"""

from __future__ import annotations

import torch

from mdmkit.core.config import require
from mdmkit.models.denoiser import KV_CACHE

NO_BLOCK = torch.iinfo(torch.long).max  # the block of a position that is not to be filled


def answer_blocks(answer: torch.Tensor, block_length: int | None) -> torch.Tensor:
    """Block index of every answer position (its rank among the row's answer positions // block_length)."""
    if block_length is None:
        return torch.where(answer, 0, NO_BLOCK)
    rank = answer.long().cumsum(1) - 1
    return torch.where(answer, rank // block_length, NO_BLOCK)


def enter_blocks(row_masked: torch.Tensor, row_block: torch.Tensor, current_block: torch.Tensor,
                 rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For batch rows `rows`, which positions lie in the block each works on (its lowest with a mask) and whether
    the row has just entered that block; `current_block` [B] is updated."""
    block = torch.where(row_masked, row_block, NO_BLOCK).min(1).values
    in_block = row_block == block[:, None]
    entered = block != current_block[rows]
    current_block[rows] = block
    return in_block, entered


def eligible_span(eligible: torch.Tensor) -> slice:
    """The narrowest column range holding every eligible position of every row (a step's math needs no more)."""
    length = eligible.shape[1]
    present = eligible.any(0)
    columns = torch.arange(length, device=eligible.device)
    first, last = torch.stack([torch.where(present, columns, length).min(),
                               torch.where(present, columns, -1).max()]).tolist()  # one wait for the host
    return slice(0, length) if last < 0 else slice(first, last + 1)


def best_of(score: torch.Tensor, pool: torch.Tensor, count: torch.Tensor, descending: bool) -> torch.Tensor:
    """Bool [R, L]: the `count[r]` best-scoring positions of `pool` per row (highest if `descending`), ties to
    the lower position."""
    key = (-score if descending else score).masked_fill(~pool, float("inf"))
    order = key.argsort(dim=1, stable=True)
    columns = torch.arange(score.shape[1], device=score.device)
    return torch.zeros_like(pool).scatter(1, order, columns[None, :] < count[:, None]) & pool


def check_sampling_fields(temperature: float, top_p: float, block_length: int | None) -> None:
    """One-line errors for the choice and block fields."""
    require(temperature >= 0.0, f"temperature={temperature} must be >= 0")
    require(0.0 < top_p <= 1.0, f"top_p={top_p} must lie in (0, 1]")
    require(block_length is None or block_length >= 1, f"block_length={block_length} must be >= 1 or null")


def check_cache_fields(cache: str, cache_refresh: int | None, block_length: int | None) -> None:
    """One-line errors for the KV-cache fields (the cache is refreshed block by block)."""
    require(cache == "none" or block_length is not None,
            f"cache={cache} needs block_length (the cache is refreshed block by block)")
    require(cache_refresh is None or cache_refresh >= 1, f"cache_refresh={cache_refresh} must be >= 1 or null")
    require(cache_refresh is None or cache != "none",
            f"cache_refresh={cache_refresh} needs a cache (cache=prefix or cache=dual)")


def cache_requirements(cache: str) -> frozenset[str]:
    """A cache needs the network's `kv_cache` capability; the plain loop needs nothing."""
    return frozenset() if cache == "none" else frozenset({KV_CACHE})

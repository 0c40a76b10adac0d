"""Random streams that are pure functions of (seed, index, rank).

Training batches, masking noise and trajectory shards each draw from the stream of their own index (the
step, the shard), so a resumed or re-sharded run replays exactly what an uninterrupted one would have drawn.
"""

from __future__ import annotations

import torch

_STRIDE = 1_000_003  # a prime larger than any step count, so (seed, index) pairs never collide


def stream_seed(seed: int, index: int, rank: int = 0, world_size: int = 1) -> int:
    """The seed of stream `index` for process `rank` of `world_size` under the run's `seed`."""
    return (seed * _STRIDE + index) * max(1, world_size) + rank


def seeded_generator(seed: int, device: torch.device | str | None = None) -> torch.Generator:
    """A fresh generator on `device` seeded with `seed`."""
    return torch.Generator(device=device or "cpu").manual_seed(seed)

"""Which rollouts each optimizer step of an RL run trains on, for both RL modules.

Rollouts are collected at the first of each `rl.inner_updates` optimizer steps, one set per micro-batch (under
gradient accumulation), and drawn from the stream of the batch they come from: batch number `batch_idx * W + rank`,
the batch the data stream hands that rank (datamodule.py). So W data-parallel processes roll out, score and update
exactly as one process accumulating W micro-batches, and a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import lightning as L

from mdmkit.core.seeding import stream_seed
from mdmkit.training.rl.step import Experience


class Collections:
    """The experience of the current optimizer step's micro-batches; `failures`: reward calls that raised."""

    def __init__(self, inner_updates: int, seed: int) -> None:
        self.inner_updates, self.seed = inner_updates, seed
        self.held: dict[int, Experience] = {}
        self.failures: Counter[str] = Counter()

    def inner(self, module: L.LightningModule) -> int:
        """The inner update this optimizer step is (0-based)."""
        return module.global_step % self.inner_updates

    def get(self, module: L.LightningModule, batch_idx: int, collect: Callable[[int], Experience]) -> Experience:
        """This micro-batch's experience: `collect(seed)` at an inner update 0 (or after a resume), logged."""
        trainer = module.trainer
        slot = batch_idx % trainer.accumulate_grad_batches
        if self.inner(module) == 0 or slot not in self.held:
            started = time.perf_counter()
            self.held[slot] = collect(stream_seed(self.seed, batch_idx * trainer.world_size + module.global_rank))
            module.log_dict({f"rl/{key}": value for key, value in self.held[slot].metrics().items()})
            module.log("rl/rollout_s", time.perf_counter() - started)
            module.log("rl/reward_failures", float(sum(self.failures.values())))
        return self.held[slot]

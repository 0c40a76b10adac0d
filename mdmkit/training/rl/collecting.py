"""Which rollouts each optimizer step of an RL run trains on, for both RL modules.

Rollouts are collected at the first of each `rl.inner_updates` optimizer steps, one set per micro-batch (under
gradient accumulation), and drawn from the stream of the batch they come from: batch number `batch_idx * W + rank`,
the batch the data stream hands that rank (datamodule.py). So W data-parallel processes roll out, score and update
exactly as one process accumulating W micro-batches, and a resumed run draws what the uninterrupted one drew. A
checkpoint saved between two inner updates keeps every rank's held experience (`state`), since the old policy that
rolled it out is gone by then: resumed there, a run goes on with the next inner update as the uninterrupted one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from mdmkit.core.seeding import stream_seed
from mdmkit.training.module import loss_on_progress_bar
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.step import Experience, inner_loss

EXPERIENCE_KEY = "rl_experience"  # a checkpoint's entry of `Collections.state`


class Collections:
    """The experience of the current optimizer step's micro-batches under the run's `rl` settings; `failures`:
    reward calls that raised."""

    def __init__(self, rl: RLConfig, seed: int) -> None:
        self.rl, self.inner_updates, self.seed = rl, rl.inner_updates, seed
        self.held: dict[int, Experience] = {}
        self.kept: dict[int, dict[str, Any]] = {}  # from a checkpoint: slot -> Experience.state(), this rank's
        self.failures: Counter[str] = Counter()

    def inner(self, module: L.LightningModule) -> int:
        """The inner update this optimizer step is (0-based)."""
        return module.global_step % self.inner_updates

    def get(self, module: L.LightningModule, batch_idx: int, collect: Callable[[int], Experience]) -> Experience:
        """This micro-batch's experience: `collect(seed)` at an inner update 0 (or after a resume), logged."""
        trainer = module.trainer
        slot = batch_idx % trainer.accumulate_grad_batches
        if self.inner(module) != 0 and slot not in self.held and slot in self.kept:
            self.held[slot] = Experience.from_state(self.kept.pop(slot), module.device)
        if self.inner(module) == 0 or slot not in self.held:
            started = time.perf_counter()
            self.held[slot] = collect(stream_seed(self.seed, batch_idx * trainer.world_size + module.global_rank))
            module.log_dict({f"rl/{key}": value for key, value in self.held[slot].metrics().items()})
            module.log("rl/rollout_s", time.perf_counter() - started)
            module.log("rl/reward_failures", float(sum(self.failures.values())))
        return self.held[slot]

    def loss(self, module: L.LightningModule, batch_idx: int, collect: Callable[[int], Experience],
             network: torch.nn.Module) -> torch.Tensor:
        """A training step of either RL module: this micro-batch's experience (`get`), the inner update's loss on
        `network` (masking with the rollouts' mask id), logged."""
        experience = self.get(module, batch_idx, collect)
        loss, metrics = inner_loss(network, self.rl, experience, self.inner(module), experience.rollouts.mask_id)
        module.log("train/loss", loss, prog_bar=loss_on_progress_bar(module))
        module.log_dict({f"rl/{key}": value for key, value in metrics.items()})
        return loss

    def state(self, module: L.LightningModule) -> dict[str, Any]:
        """What a checkpoint keeps: where the next step is not an inner update 0, the experience each rank holds
        (gathered from every rank of a data-parallel run, which all save), else nothing."""
        if module.global_step % self.inner_updates == 0:
            return {}
        mine = {slot: experience.state() for slot, experience in self.held.items()}
        world_size = module.trainer.world_size
        every: list[Any] = [mine]
        if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            every = [None] * world_size
            torch.distributed.all_gather_object(every, mine)
        return {"step": module.global_step, "world_size": world_size, "ranks": every}

    def restore(self, module: L.LightningModule, state: dict[str, Any]) -> None:
        """Keep this rank's experience of a checkpoint's `state` for the inner updates left of its batch (taken up
        by `get`). A run resumed with another number of processes collects afresh there instead."""
        ranks = state.get("ranks")
        if ranks is not None and state["world_size"] == module.trainer.world_size:
            self.kept = dict(ranks[module.global_rank])


class HoldsExperience(L.LightningModule):
    """The checkpoint hooks of an RL module whose `collections` (kept in `__dict__`, out of Lightning's
    attributes) hold the experience between inner updates: saved with the checkpoint, taken up on resume."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[EXPERIENCE_KEY] = self.__dict__["collections"].state(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.__dict__["collections"].restore(self, checkpoint.get(EXPERIENCE_KEY, {}))

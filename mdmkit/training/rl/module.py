"""LightningModule of an RL run: an MDM module whose training step is rollouts, rewards and policy updates.

Each optimizer step is one inner update. Step s works on the rollouts of step s - (s mod mu), collected at that
step from its batch of prompts (the other steps' batches go unused), so `trainer.max_steps` counts updates and the
learning-rate schedule, checkpoints and resume work as for any MDM run. A run resumed between inner updates
collects afresh at the step it resumes from. Validation and the saved model are the MDM module's (set
`ema_decay: 0` so that they are the trained weights, not an average over RL's few steps).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from typing import Any

import torch

from mdmkit.core.seeding import stream_seed
from mdmkit.training.module import MDMModule, loss_on_progress_bar
from mdmkit.training.preflight import MDMParts, RLParts
from mdmkit.training.rl.step import Experience, collect, inner_loss
from mdmkit.training.run_config import RunConfig


class RLModule(MDMModule):
    """Network (trained), reference (frozen copy of the starting network, kept where the loss has a KL term),
    the RL settings; the MDM module's EMA, validation and optimizer."""

    def __init__(self, config: dict[str, Any], parts: MDMParts, run: RunConfig) -> None:
        assert isinstance(parts, RLParts), "an RL run's plan holds RLParts"
        super().__init__(config, parts, run)
        self.rl = parts.rl
        self.reference = self._frozen_copy() if self.rl.keeps_reference else None
        self.failures: Counter[str] = Counter()  # reward calls that raised, by reward name
        self.__dict__["_experience"] = None  # the rollouts the current step's inner updates share

    def _frozen_copy(self) -> torch.nn.Module:
        return copy.deepcopy(self.network).requires_grad_(False)  # put in eval mode where it scores (step.py)

    def start_from(self, network: torch.nn.Module) -> None:
        """The trained MDM's weights, which the reference also keeps."""
        super().start_from(network)
        if self.reference is not None:
            self.reference.load_state_dict(self.network.state_dict())

    def experience(self, batch: tuple[torch.Tensor, ...]) -> Experience:
        """This step's rollouts: collected at the first inner update of each group of `rl.inner_updates` steps."""
        index, inner = divmod(self.global_step, self.rl.inner_updates)
        current: Experience | None = self.__dict__["_experience"]
        if inner == 0 or current is None:
            tokens, answer_mask = batch[0], batch[1]
            seed = stream_seed(self.run.seed, index, self.global_rank, self.trainer.world_size)
            started = time.perf_counter()
            current = collect(self.network, self.reference, self.rl, self.task, tokens, answer_mask, seed,
                              self.failures)
            self.__dict__["_experience"] = current
            self.log_dict({f"rl/{key}": value for key, value in current.metrics().items()})
            self.log("rl/rollout_s", time.perf_counter() - started)
            self.log("rl/reward_failures", float(sum(self.failures.values())))
        return current

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        experience = self.experience(batch)
        inner = self.global_step % self.rl.inner_updates
        loss, metrics = inner_loss(self.train_network, self.rl, experience, inner, self.task.mask_id)
        self.log("train/loss", loss, prog_bar=loss_on_progress_bar(self))
        self.log_dict({f"rl/{key}": value for key, value in metrics.items()})
        return loss

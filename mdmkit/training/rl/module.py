"""LightningModule of an RL run: an MDM module whose training step is rollouts, rewards and policy updates.

Each optimizer step is one inner update. Step s works on the rollouts of step s - (s mod mu), collected at that
step from its batch of prompts (the other steps' batches go unused; collecting.py), so `trainer.max_steps` counts
updates and the learning-rate schedule, checkpoints and resume work as for any MDM run (a checkpoint saved between
inner updates keeps the experience being trained on, so a run resumed there goes on exactly). Validation and the
saved model are the MDM module's (set `ema_decay: 0` so that they are the trained weights, not an average over
RL's few steps).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from mdmkit.training.module import MDMModule
from mdmkit.training.preflight import MDMParts, RLParts
from mdmkit.training.rl.collecting import Collections, HoldsExperience
from mdmkit.training.rl.step import Experience, collect
from mdmkit.training.run_config import RunConfig


class RLModule(HoldsExperience, MDMModule):
    """Network (trained), reference (frozen copy of the starting network, kept where the loss has a KL term),
    the RL settings; the MDM module's EMA, validation and optimizer."""

    def __init__(self, config: dict[str, Any], parts: MDMParts, run: RunConfig) -> None:
        assert isinstance(parts, RLParts), "an RL run's plan holds RLParts"
        super().__init__(config, parts, run)
        self.rl = parts.rl
        self.reference = self._frozen_copy() if self.rl.keeps_reference else None
        self.__dict__["collections"] = Collections(self.rl, run.seed)

    def _frozen_copy(self) -> torch.nn.Module:
        return copy.deepcopy(self.network).requires_grad_(False)  # put in eval mode where it scores (step.py)

    def start_from(self, network: torch.nn.Module) -> None:
        """The trained MDM's weights, which the reference also keeps."""
        super().start_from(network)
        if self.reference is not None:
            self.reference.load_state_dict(self.network.state_dict())

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        collections: Collections = self.__dict__["collections"]

        def collected(seed: int) -> Experience:
            return collect(self.network, self.reference, self.rl, self.task, batch[0], batch[1], seed,
                           collections.failures)

        return collections.loss(self, batch_idx, collected, self.train_network)

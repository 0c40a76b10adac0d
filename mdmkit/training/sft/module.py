"""LightningModule that fine-tunes a pretrained diffusion LLM on prompt-response pairs.

The network is mdmkit's own DiffusionLM, loaded from the hub layout; LoRA (peft) adds adapters in place, so
the module's state dict is the network's (with the adapters) under `network.`. No EMA: at 7-8B parameters it would
cost a copy of the weights, and fine-tuning runs are short. Under LoRA a checkpoint holds the adapters only (megabytes,
not the base's gigabytes) and the fingerprint of the base, which a resume reloads from `sft.model` and checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch

from mdmkit.core.errors import CheckpointError
from mdmkit.core.seeding import seeded_generator
from mdmkit.evaluation.text_eval import model_fingerprint
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.lora import add_lora
from mdmkit.training.module import loss_on_progress_bar
from mdmkit.training.optim import OptimConfig
from mdmkit.training.sft.config import SFTParts

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig

NETWORK_PREFIX = "network."  # the network's weights in the module's state dict
BASE_KEY = "sft_base"  # in a LoRA run's checkpoint: the fingerprint of the frozen base it needs


class SFTModule(L.LightningModule):
    def __init__(self, config: dict[str, Any], parts: SFTParts, network: DiffusionLM) -> None:
        """`config`: the resolved run config, recorded in checkpoints; `parts`: what the plan built of it."""
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.config = config
        self.sft = parts.sft
        self.objective = parts.objective
        self.optim: OptimConfig = parts.optim
        self.mask_id = network.mask_id
        network.gradient_checkpointing = self.sft.gradient_checkpointing
        self.network = network if self.sft.lora is None else add_lora(network, self.sft.lora)

    def checkpointed(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What of a state dict a checkpoint keeps: under LoRA the adapters, the frozen base being `sft.model`'s."""
        if self.sft.lora is None:
            return state
        return {name: tensor for name, tensor in state.items() if ".lora_" in name}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.sft.lora is not None:
            checkpoint["state_dict"] = self.checkpointed(checkpoint["state_dict"])
            checkpoint[BASE_KEY] = model_fingerprint(self.sft.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        base = checkpoint.get(BASE_KEY)
        if base is None:
            return
        if base != model_fingerprint(self.sft.model):
            raise CheckpointError(f"sft.model={self.sft.model} is not the base model this checkpoint's adapters were "
                                  "trained on (its config or weight files differ)")
        # the base as loaded from sft.model, the adapters from the checkpoint
        checkpoint["state_dict"] = {**self.state_dict(), **checkpoint["state_dict"]}

    def trained_parameters(self) -> int:
        return sum(p.numel() for p in self.network.parameters() if p.requires_grad)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tokens, answer_mask, noise_seed = batch
        generator = seeded_generator(noise_seed, tokens.device)
        return self.objective(self.network, tokens, answer_mask, self.mask_id, generator)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor, int], batch_idx: int) -> torch.Tensor:
        loss, metrics = self._loss(batch)
        self.log("train/loss", loss, prog_bar=loss_on_progress_bar(self))
        self.log_dict({f"train/{k}": v for k, v in metrics.items()})
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor, int], batch_idx: int) -> None:
        loss, metrics = self._loss(batch)
        size = len(batch[0])
        self.log("val/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("val/masked_acc", metrics["masked_acc"], batch_size=size, sync_dist=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return self.optim.configure(self.network, self.trainer.max_steps)

    def on_train_start(self) -> None:
        # after a resume has loaded the optimizer state: this run's settings (overrides included)
        self.optim.apply_to(self)

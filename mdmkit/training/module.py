"""LightningModule that trains a masked diffusion network with a pluggable objective.

It takes the parts the run's plan built (`MDMParts`) and records the resolved run config in its checkpoints, from
which `from_config` (and evaluation, through mdmkit.io.checkpoint) rebuild it: the checkpoint file is all they need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch

from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.evaluation.runner import sample_split
from mdmkit.tasks.base import Split
from mdmkit.training.ema import EMA
from mdmkit.training.optim import OptimConfig
from mdmkit.training.preflight import MDMParts, build_parts
from mdmkit.training.run_config import DataConfig, RunConfig

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig


def step_generator(module: L.LightningModule, seed: int, salt: int) -> torch.Generator:
    """Noise for one step (`salt`) of a run of `seed`: a function of (seed, step, rank), so a resumed run draws the
    same."""
    return seeded_generator(stream_seed(seed, salt, module.global_rank, module.trainer.world_size), module.device)


def loss_on_progress_bar(module: L.LightningModule) -> bool:
    """Whether the training loss goes to a progress bar: only where one shows. Lightning turns a bar's values into
    Python numbers after every step, a GPU sync that stops the host queueing the next step ahead of the GPU."""
    return module.trainer.progress_bar_callback is not None


class MDMModule(L.LightningModule):
    """Network + objective + EMA; validation reports masked loss and a fixed sampler's accuracy."""

    def __init__(self, config: dict[str, Any], parts: MDMParts, run: RunConfig) -> None:
        """`config`: the resolved run config, recorded in checkpoints; `parts` and `run`: what the plan built of
        it."""
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.config = config
        self.task = parts.task
        self.network = parts.model.build()
        self.objective = parts.objective
        self.optim: OptimConfig = parts.optim
        self.val_sampler = parts.val_sampler
        self.run = run
        self.ema = EMA(self.network, self.run.ema_decay)
        self.__dict__["_compiled"] = (None, None)  # (network, its compiled wrapper): kept out of the state dict

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MDMModule:
        """The module of a resolved run config (a recorded one, or a composed one in a script), its parts built
        and checked as a run's plan builds them."""
        return cls(config, build_parts(config, DataConfig.from_config(config["data"])), RunConfig.from_config(config))

    @property
    def train_network(self) -> torch.nn.Module:
        """What training steps call: the network, torch.compile'd with `compile` set (true, or a torch.compile mode
        such as reduce-overhead: CUDA graphs). Shapes are fixed, so a GPU's kernels fuse. Compiled on first use, and
        again if a strategy has wrapped the network since; validation, sampling and the saved model use the plain
        network."""
        mode = self.run.compile
        if not mode:
            return self.network
        network, compiled = self.__dict__["_compiled"]
        if network is not self.network:
            compiled = torch.compile(self.network, mode=None if mode is True else mode)
            self.__dict__["_compiled"] = (self.network, compiled)
        return compiled

    def start_from(self, network: torch.nn.Module) -> None:
        """Copy a trained network's weights in (same architecture) and restart the EMA from them."""
        self.network.load_state_dict(network.state_dict())
        self.ema = EMA(self.network, self.ema.decay)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        tokens, answer_mask = batch
        generator = step_generator(self, self.run.seed, self.global_step)
        loss, metrics = self.objective(self.train_network, tokens, answer_mask, self.task.mask_id, generator)
        self.log("train/loss", loss, prog_bar=loss_on_progress_bar(self))
        self.log_dict({f"train/{k}": v for k, v in metrics.items()})
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # here rather than in on_train_batch_end, which runs after the checkpoint callback has saved
        self.ema.update(self.network, self.global_step)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        tokens, answer_mask = batch
        with self.ema.swapped_in(self.network):
            loss, metrics = self.objective(
                self.network, tokens, answer_mask, self.task.mask_id,
                step_generator(self, self.run.seed, -1 - batch_idx)
            )
            split = Split(tokens, answer_mask, keys=None)  # type: ignore[arg-type]  # no keys: sample_split reads none
            result = sample_split(self.network, self.task, split, self.val_sampler, batch_size=len(tokens))
            assert result is not None, "one process's result"
        size = len(tokens)
        self.log("val/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("val/masked_acc", metrics["masked_acc"], batch_size=size, sync_dist=True)
        self.log("val/accuracy", result.accuracy, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("val/nfe", float(result.nfe.mean()), batch_size=size, sync_dist=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return self.optim.configure(self.network, self.trainer.max_steps)

    def on_train_start(self) -> None:
        # after a resume has loaded the checkpoint's optimizer state: the run's own settings (overrides included)
        self.optim.apply_to(self)

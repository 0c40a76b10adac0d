"""LightningModule that trains the NI indicator with cross-entropy on merge labels, the base MDM frozen.

Each training example is a recorded trajectory rolled back to a uniform step t': one frozen base forward at
that state gives both the indicator's features and (through the network's argmax) the merge labels of the
still-masked positions. Validation reports the label metrics of the positive class at the sampler's epsilon,
and runs the NI sampler itself on the held-out trajectories' prompts: how often it reproduces the base
sampler's output, with how many forwards, beside the oracle floor of those trajectories.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.classification import BinaryAccuracy, BinaryPrecision, BinaryRecall

from mdmkit.core.config import build, require
from mdmkit.core.seeding import seeded_generator
from mdmkit.io.checkpoint import TrainedModel, build_task
from mdmkit.models.indicator import IndicatorScorer
from mdmkit.objectives.indicator import labelled_examples
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.protocol import Sampled
from mdmkit.samplers.rules.ni import NISampler, log_odds_threshold
from mdmkit.samplers.rules.oracle import oracle_floor
from mdmkit.training.indicator.data import Batch
from mdmkit.training.indicator.trajectories import TrajectoryConfig
from mdmkit.training.module import loss_on_progress_bar, step_generator
from mdmkit.training.optim import OptimConfig

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig


class IndicatorModule(L.LightningModule):
    """Frozen base network (`trajectories.checkpoint`) + trainable indicator; `sampler` is the NI sampler."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.config = config
        self.task = build_task(config)
        self.trajectories: TrajectoryConfig = build(config["trajectories"], "trajectories")
        self.base = TrainedModel(self.trajectories.checkpoint).network(self.task).requires_grad_(False)
        spec = build(config["indicator"], "indicator")
        self.indicator = spec.build(self.base.config.d_model, self.task.vocab_size)
        self.optim: OptimConfig = build(config["optim"], "optim")
        scorer = IndicatorScorer(self.indicator, self.base.embed)  # scores with the indicator being trained
        self.sampler: NISampler = build(config["sampler"], "sampler", indicator=scorer)
        require(isinstance(self.sampler, NISampler), "sampler: an indicator run evaluates an NI sampler (ni)")
        self.threshold = log_odds_threshold(self.sampler.epsilon)
        self.val_metrics = torch.nn.ModuleDict(
            {"accuracy": BinaryAccuracy(), "precision": BinaryPrecision(), "recall": BinaryRecall()}
        )

    def train(self, mode: bool = True) -> IndicatorModule:
        super().train(mode)
        self.base.eval()  # frozen: never in training mode
        return self

    def _labelled(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return labelled_examples(self.base, self.indicator, batch, self.task.mask_id, generator)

    def _predicted(self, logits: torch.Tensor) -> torch.Tensor:
        """Positive-class decisions at the sampler's epsilon."""
        return (logits[:, 1] - logits[:, 0]) >= self.threshold

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits, labels = self._labelled(batch, step_generator(self, self.config["seed"], self.global_step))
        loss = F.cross_entropy(logits, labels)
        predicted, positive = self._predicted(logits), labels.bool()
        hits = (predicted & positive).sum()
        self.log("train/loss", loss, prog_bar=loss_on_progress_bar(self))
        self.log_dict({
            "train/accuracy": (predicted == positive).float().mean(),
            "train/precision": hits / predicted.sum().clamp(min=1),
            "train/recall": hits / positive.sum().clamp(min=1),
            "train/positive_rate": positive.float().mean(),
        })
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        logits, labels = self._labelled(batch, step_generator(self, self.config["seed"], -1 - batch_idx))
        size = len(batch[0])
        self.log("val/loss", F.cross_entropy(logits, labels), prog_bar=True, batch_size=size, sync_dist=True)
        for name, metric in self.val_metrics.items():
            assert isinstance(metric, Metric), "val_metrics holds metrics"
            metric(self._predicted(logits), labels)
            self.log(f"val/{name}", metric, batch_size=size)
        self._log_sampling(batch, size)

    @torch.no_grad()
    def _log_sampling(self, batch: Batch, size: int) -> None:
        """NI sampling from held-out prompts, against the base sampler's recorded outputs and oracle floor."""
        tokens, reveal_step, steps = batch
        mask_id = self.task.mask_id
        prompts = tokens.masked_fill(reveal_step >= 0, mask_id)
        counter = ForwardCounter(self.base, size)
        sampled = self.sampler.sample(counter, prompts, mask_id, seeded_generator(0, self.device))
        floor = oracle_floor(self.base, prompts, Sampled(tokens, reveal_step, steps), mask_id)
        self.log_dict({  # floats: the counter's tallies live on the CPU
            "val/ni_agreement": float((sampled.tokens == tokens).all(1).float().mean()),
            "val/ni_nfe": float(counter.nfe.float().mean()),
            "val/ni_cost": float(counter.cost.mean()),
            "val/base_nfe": float(steps.float().mean()),
            "val/oracle_nfe": float(floor.float().mean()),
        }, batch_size=size, sync_dist=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return self.optim.configure(self.indicator, self.trainer.max_steps)

    def on_train_start(self) -> None:
        self.optim.apply_to(self)  # a resume's overrides win

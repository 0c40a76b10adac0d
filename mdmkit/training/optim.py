"""The optimizer settings of a training run (no Lightning here: the CLI validates them before importing it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mdmkit.core.config import Validated, duration_seconds, require

if TYPE_CHECKING:
    import lightning as L
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig

ANNEAL_BY = ("max_steps", "max_time")  # what ends the cosine decay (OptimConfig.anneal_by)


@dataclass
class OptimConfig(Validated):
    """AdamW with linear warm-up then cosine decay to `min_lr_ratio * lr` at the last step.

    `anneal_by="max_time"` ends the decay by `trainer.max_time` where that comes before `trainer.max_steps`: a
    time-boxed leg (a device call) then stops annealed instead of at a learning rate still near its peak.
    `anneal_time` ("DD:HH:MM:SS") makes that decay span the training time of a run resumed over several calls
    instead of this call's limit: a session's first call stops part-way down and the resumed second ends it.
    """

    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 500
    min_lr_ratio: float = 0.1
    anneal_by: str = "max_steps"  # or max_time: the cosine ends by trainer.max_time where that comes first
    anneal_time: str | None = None  # with max_time: "DD:HH:MM:SS", the time the decay spans over a resumed run's calls

    def validate(self) -> None:
        require(self.lr > 0, f"lr={self.lr} must be > 0")
        require(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
        require(all(0 <= b < 1 for b in self.betas), f"betas={self.betas} must lie in [0, 1)")
        require(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")
        require(self.anneal_by in ANNEAL_BY, f"anneal_by={self.anneal_by} must be one of {', '.join(ANNEAL_BY)}")
        require(self.anneal_time is None or (duration_seconds(self.anneal_time) or 0) > 0,
                f"anneal_time={self.anneal_time} must be null or a positive \"DD:HH:MM:SS\" (e.g. '00:00:11:30')")
        require(self.anneal_time is None or self.anneal_by == "max_time",
                "anneal_time is the time the decay spans: it needs anneal_by=max_time")

    def adamw(self, network: torch.nn.Module) -> torch.optim.AdamW:
        """AdamW over the trainable parameters; weight decay on matrices only (not biases, norms)."""
        params = [p for p in network.parameters() if p.requires_grad]
        matrices, others = self._group_decays()
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": matrices},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": others},
        ]
        return torch.optim.AdamW(groups, lr=self.lr, betas=self.betas)

    def _group_decays(self) -> tuple[float, float]:
        """The weight decay of `adamw`'s two parameter groups: matrices, then biases and norms."""
        return self.weight_decay, 0.0

    def apply_to(self, module: L.LightningModule) -> None:
        """Put these settings back into the optimizer and schedule (those of `configure`) that a resume restored
        from a checkpoint, whose learning rate, betas and weight decay are the old run's: an override given on
        resume must take effect."""
        wrapped, schedule = module.optimizers(), module.lr_schedulers()
        assert not isinstance(wrapped, list) and isinstance(schedule, WarmupCosine), "the pair `configure` makes"
        optimizer = wrapped.optimizer
        schedule.base_lrs = [self.lr] * len(optimizer.param_groups)
        factor = schedule.lr_lambdas[0](schedule.last_epoch)
        for group, decay in zip(optimizer.param_groups, self._group_decays(), strict=True):
            group.update(initial_lr=self.lr, lr=self.lr * factor, betas=self.betas, weight_decay=decay)

    def configure(self, network: torch.nn.Module, max_steps: int) -> OptimizerLRSchedulerConfig:
        """AdamW and its per-step schedule over `max_steps` (a 100k-step one if <= 0), as a LightningModule's
        `configure_optimizers` returns them."""
        optimizer = self.adamw(network)
        schedule = WarmupCosine(optimizer, self, max_steps if max_steps > 0 else 100_000)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def lr_factor(self, step: int, total_steps: int, time_spent: float = 0.0) -> float:
        """The learning rate over `lr` at `step`; past the warm-up the cosine stands at whichever is further on,
        the steps or the fraction `time_spent` of a time budget."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, max((step - self.warmup_steps) / max(1, total_steps - self.warmup_steps), time_spent))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine(torch.optim.lr_scheduler.LambdaLR):
    """`OptimConfig`'s schedule, step by step. `time_spent` (0 to 1) is set from outside while training against a
    time budget (`anneal_by="max_time"`: mdmkit.training.callbacks.AnnealByTime); it stays 0 otherwise."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int) -> None:
        self.time_spent = 0.0
        super().__init__(optimizer, lambda step: config.lr_factor(step, total_steps, self.time_spent))

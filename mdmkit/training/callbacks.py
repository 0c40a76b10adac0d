"""Lightning callbacks of a training run: logged steps that survive a resume, a progress bar that counts steps,
a time limit per call, and a learning-rate decay that ends by that limit."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, RichProgressBar, Timer, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from mdmkit.training.optim import WarmupCosine


class LogAtGlobalStep(Callback):
    """Log each batch's metrics at the trainer's global step.

    Lightning logs at a counter of its own (`_batches_that_stepped`), which a run resumed from a checkpoint saved
    at the end of training restores one too high: a 10+10-step run logged step 10's loss at step 11. The global
    step is restored exactly, and equals that counter in an uninterrupted run. Goes first among the callbacks,
    before the learning-rate monitor logs at the same counter.
    """

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        if hasattr(loop, "_batches_that_stepped"):
            loop._batches_that_stepped = trainer.global_step


class StepProgressBar(RichProgressBar):
    """Rich's bar without `Epoch 0/-2`: training is a number of steps over an endless stream, not epochs. It
    counts steps up to `max_steps` (Lightning's counts a resumed run's steps against the steps left: 20/10)."""

    @property
    def total_train_batches(self) -> int | float:
        steps = self.trainer.max_steps
        return steps if steps and steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"steps to {self.trainer.max_steps}"
        return f"{description:{len(self.validation_description)}}"


def progress_bar() -> Callback:
    """The progress bar a run shows (Lightning's own choice, with the step description where it is Rich's)."""
    return StepProgressBar() if _RICH_AVAILABLE else TQDMProgressBar()


class CallTimer(Timer):
    """`trainer.max_time` as the limit of this call alone. Lightning's own timer restores the training time of
    the calls before from a checkpoint, so a resumed leg given the same limit as the last stopped before its
    first step: a training chained over time-boxed device calls never went on."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def spent(self) -> float:
        """The fraction of the limit used so far (0 to 1)."""
        elapsed, left = self.time_elapsed(), self.time_remaining()
        return 0.0 if left is None else min(1.0, elapsed / max(elapsed + left, 1e-9))


class AnnealByTime(Callback):
    """`optim.anneal_by=max_time`: before each step, tell the schedule what fraction of the call's time is spent.
    Rank 0's clock decides, so every process of a multi-GPU run takes the same learning rate."""

    def __init__(self, timer: CallTimer) -> None:
        self.timer = timer

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        spent = trainer.strategy.broadcast(self.timer.spent())
        for config in trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, WarmupCosine):
                config.scheduler.time_spent = spent

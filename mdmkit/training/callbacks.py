"""Lightning callbacks of a training run: logged steps that survive a resume, a progress bar that counts steps."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE


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

"""Lightning callbacks of a training run: checkpoints that keep the step reached, logged steps that survive a
resume, progress that counts steps (a bar, or lines in a log file), a time limit per call, and a learning-rate
decay that ends by that limit or by a time span over the calls of a resumed run."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar, Timer, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from mdmkit.core.progress import LOG_EVERY_S, on_terminal
from mdmkit.training.optim import WarmupCosine


class RunCheckpoints(ModelCheckpoint):
    """`last.ckpt` that holds the step reached: written every `every` steps (`checkpoint_every`, else each
    validation's), at the step training ended at (Lightning skips that once any last.ckpt was written, keeping the
    last validation's when a time limit stops between them), and on Ctrl-C, SIGTERM or a crash in one process once
    training has started (a failed resume never overwrites the run's good checkpoint). `keep_every`: also keep
    `stepNNNNNNN.ckpt` files. In several processes an exception saves nothing: a rank that is gone would be
    waited for."""

    def __init__(self, dirpath: Any, every: int | None, keep_every: bool) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="step{step:07d}",  # no '=' in file names: they must pass as Hydra overrides (ckpt_path=...)
            auto_insert_metric_name=False,
            save_last=True,
            save_top_k=-1 if keep_every else 0,
            every_n_train_steps=every,
            enable_version_counter=False,  # a resumed run (moved or not) writes its own last.ckpt, never last-v1
        )
        self._training = False

    @property
    def saved_step(self) -> int:
        """The global step of the last checkpoint this run wrote (0: none)."""
        return self._last_global_step_saved

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._training = True  # the checkpoint, optimizer included, is restored by now

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._training and trainer.world_size == 1:
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_step != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class LogAtGlobalStep(Callback):
    """Log each batch's metrics at the trainer's global step.

    Lightning logs at a counter of its own (`_batches_that_stepped`), which a run resumed from a checkpoint saved
    at the end of training restores one too high: a 10+10-step run would log step 10's loss at step 11. The global
    step is restored exactly, and equals that counter in an uninterrupted run. Goes first among the callbacks,
    before the learning-rate monitor logs at the same counter.
    """

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        if hasattr(loop, "_batches_that_stepped"):
            loop._batches_that_stepped = trainer.global_step


class BatchesFromGlobalStep(Callback):
    """Validate every `val_check_interval` steps counted from step 0 after a resume too.

    Lightning decides when to validate (and when to step under gradient accumulation) by batch counters of its own,
    which a checkpoint saved mid-batch (Ctrl-C, SIGTERM, a crash) restores a batch ahead: resumed from step 11 with
    validation every 5 steps, a run validated after steps 14 and 19 instead of 15 and 20. At the first batch of each
    call the counters are set from the global step, where the training loader goes on from too
    (`datamodule.step_indexed_loader`). Goes beside `LogAtGlobalStep`, which does the same for the logged step.
    """

    def __init__(self) -> None:
        self.counted = False

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.counted = False

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.counted:
            return
        self.counted = True
        progress = trainer.fit_loop.epoch_loop.batch_progress  # this batch is counted ready, not yet started
        shift = trainer.global_step * trainer.accumulate_grad_batches - progress.total.completed
        for counter in (progress.total, progress.current):  # `current`: this epoch's, which a resume resets
            counter.completed = max(0, counter.completed + shift)
            counter.reset_on_restart()  # every stage at `completed`
            counter.ready += 1


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


class ProgressLines(Callback):
    """Progress for a log file (nohup, SLURM), where a bar shows only its last frame: a line with the step, the
    loss, the last validation loss, the rate and the time left every `every_s` seconds of training, after each
    validation, and at the end. `clock`: seconds."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.start: tuple[int, float] = (0, 0.0)  # (step, clock) training (re)started at
        self.printed = 0.0
        self.printed_step = -1

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.start = (trainer.global_step, self.clock())
        self.printed = self.start[1]

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.clock() - self.printed >= self.every_s:
            self._line(trainer)

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            self._line(trainer)

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != self.printed_step:  # else a validation at the last step has just said it
            self._line(trainer)

    def _line(self, trainer: L.Trainer) -> None:
        self.printed = now = self.clock()
        self.printed_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        step, total = trainer.global_step, trainer.max_steps
        rate = (step - self.start[0]) / max(now - self.start[1], 1e-9)
        parts = [f"step {step}/{total}" if total and total > 0 else f"step {step}"]
        for name, shown in (("train/loss", "loss"), ("val/loss", "val loss")):
            value = trainer.callback_metrics.get(name)
            if value is not None:
                parts.append(f"{shown} {float(value):.4f}")
        parts.append(f"{rate:.2f} steps/s")
        if total and total > step and rate > 0:
            parts.append(f"{_clock_time((total - step) / rate)} left")
        print(" | ".join(parts), flush=True)


def _clock_time(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


def progress_callback() -> Callback:
    """How a run shows its progress: a bar on a terminal (Lightning's own choice, with the step description where
    it is Rich's), plain lines in a log file."""
    if not on_terminal(sys.stdout):
        return ProgressLines()
    return StepProgressBar() if _RICH_AVAILABLE else TQDMProgressBar()


class StepRate(Callback):
    """Logs `train/steps_per_s` every `trainer.log_every_n_steps` steps: the steps of that window over its seconds,
    validation left out. The loggers read the logged tensors once a window, which waits for the GPU, so the
    host's clock cannot run ahead of it by more than a window: over a window it times the GPU's steps. The first
    window holds the start-up (a compile): a leg's rate is the median of its windows."""

    def __init__(self) -> None:
        self.window: tuple[int, float] | None = None  # (step, clock) the window began at
        self.validation_seconds = 0.0  # within the window
        self.validation_began = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        step, now = trainer.global_step, time.perf_counter()
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning, undeclared on Trainer
        if every == 0 or (self.window is not None and step - self.window[0] < every):  # 0: Lightning logs nothing
            return
        if self.window is not None:
            seconds = now - self.window[1] - self.validation_seconds
            for logger in trainer.loggers:
                logger.log_metrics({"train/steps_per_s": (step - self.window[0]) / seconds}, step=step)
        self.window, self.validation_seconds = (step, now), 0.0

    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.validation_began = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.validation_seconds += time.perf_counter() - self.validation_began


class CallTimer(Timer):
    """`trainer.max_time` as the limit of this call alone: Lightning's own timer restores the training time of
    the calls before from a checkpoint, so a resumed leg given the same limit as the last would stop before its
    first step."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def spent(self) -> float:
        """The fraction of the limit used so far (0 to 1)."""
        elapsed, left = self.time_elapsed(), self.time_remaining()
        return 0.0 if left is None else min(1.0, elapsed / max(elapsed + left, 1e-9))


class AnnealByTime(Callback):
    """`optim.anneal_by=max_time`: before each step, tell the schedule what fraction of its time is spent: of
    this call's limit, or of `span` seconds (`optim.anneal_time`) of training counted over every call of a run
    resumed from its checkpoints (the seconds before this call travel in them). Rank 0's clock decides, so every
    process of a multi-GPU run takes the same learning rate."""

    def __init__(self, timer: CallTimer, span: float | None = None) -> None:
        self.timer, self.span = timer, span
        self.seconds_before = 0.0  # training time of the calls this run resumed from
        self.seconds = 0.0  # training time of the run at the end of its last step, over all its calls

    def _run_seconds(self) -> float:
        return self.seconds_before + self.timer.time_elapsed("train")

    def spent(self) -> float:
        return self.timer.spent() if self.span is None else min(1.0, self._run_seconds() / self.span)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        spent = trainer.strategy.broadcast(self.spent())
        for config in trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, WarmupCosine):
                config.scheduler.time_spent = spent

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # not at the checkpoint: the validation Lightning runs once the time limit has stopped training is no
        # training time, and on a CPU it can take minutes
        self.seconds = self._run_seconds()

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seconds_before = self.seconds = float(state_dict.get("seconds", 0.0))

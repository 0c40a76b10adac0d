"""`train.py experiment=...`: train a masked diffusion model, then evaluate it on the test split."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from mdmkit.core.config import build, duration_seconds
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import ConfigError
from mdmkit.core.progress import on_terminal
from mdmkit.evaluation.evaluate import evaluate_test_split, format_summary
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.io.checkpoint import (
    TrainedModel,
    architecture_error,
    read_lightning_checkpoint,
    save_slim,
    shape_mismatch,
)
from mdmkit.io.naming import derive_family, row_label
from mdmkit.io.results import append_record
from mdmkit.tasks.base import PuzzleTask
from mdmkit.training.callbacks import (
    AnnealByTime,
    BatchesFromGlobalStep,
    CallTimer,
    LogAtGlobalStep,
    RunCheckpoints,
    StepRate,
    progress_callback,
)
from mdmkit.training.datamodule import PuzzleDataModule
from mdmkit.training.module import MDMModule
from mdmkit.training.preflight import TrainingPlan
from mdmkit.training.resume import require_resumable, wandb_run_id
from mdmkit.training.run_config import DataConfig, RunConfig
from mdmkit.training.run_record import CALLS_FILE, RunHistory, ValidationLosses


def _loggers(plan: TrainingPlan, output_dir: Path) -> list[Any]:
    loggers = []
    for name, node in (plan.config.get("logger") or {}).items():
        if node is None:
            continue
        options: dict[str, Any] = {"save_dir": str(output_dir)}
        wandb = str(node.get("_target_", "")).endswith("WandbLogger")
        if wandb and plan.run.ckpt_path is not None and node.get("id") is None and (run_id := wandb_run_id(output_dir)):
            options["id"] = run_id  # a resumed run goes on in the same wandb run
        logger = build(node, f"logger.{name}", **options)
        if wandb:  # Lightning passes `anonymous`, which wandb warns is deprecated on every run
            getattr(logger, "_wandb_init", {}).pop("anonymous", None)
        loggers.append(logger)
    return loggers


def _finish_wandb() -> None:
    """Close a wandb run even when training failed, so one broken job never breaks a multirun; say where it is
    (in one line: wandb's own banner is off, see cli/process.py)."""
    wandb = sys.modules.get("wandb")
    if wandb is None or wandb.run is None:
        return
    run = wandb.run
    local = getattr(run.settings, "sync_dir", None)
    where = f"{local} (upload: wandb sync {local})" if getattr(run, "offline", False) else run.url
    print(f"wandb: run {run.id} in {where}")
    wandb.finish()


@runtime_checkable
class Checkpointed(Protocol):
    """A module whose checkpoints leave out what it rebuilds (a frozen base)."""

    def checkpointed(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


def ran_fast_dev_run(trainer: L.Trainer) -> bool:
    """Whether `trainer` ran Lightning's smoke test (`trainer.fast_dev_run`): then nothing is evaluated after it."""
    return bool(trainer.fast_dev_run)  # type: ignore[attr-defined]  # set by Lightning, undeclared on Trainer


def seed_run(run: RunConfig) -> None:
    """Seed everything a training run draws from, before anything is built."""
    L.seed_everything(run.seed, workers=True, verbose=False)


def check_resume(plan: TrainingPlan, module: L.LightningModule) -> None:
    """`ckpt_path` must hold this network (else one line naming the config fields that differ) and be short of
    `trainer.max_steps` (a resume that trains nothing is a mistake)."""
    path = plan.run.ckpt_path
    if path is None:
        return
    checkpoint = read_lightning_checkpoint(path)
    expected = module.state_dict()
    if isinstance(module, Checkpointed):
        expected = module.checkpointed(expected)
    mismatch = shape_mismatch(expected, checkpoint["state_dict"])
    if mismatch is not None:
        saved = checkpoint.get("hyper_parameters", {}).get("config", {})
        raise architecture_error("ckpt_path", path, saved, getattr(module, "config", {}), mismatch)
    if not plan.trainer.get("fast_dev_run"):
        require_resumable(checkpoint["global_step"], plan.trainer["max_steps"], path)


def start_from(module: MDMModule, path: str) -> None:
    """Fine-tuning: the trained model's (EMA) weights, or one line naming the fields its architecture differs in."""
    trained = TrainedModel(path)
    network = trained.network(module.task)
    try:
        module.start_from(network)
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        raise architecture_error("init_from", path, trained.config, module.config, lines[-1]) from None


def _time_limit(plan: TrainingPlan) -> list[Callback]:
    """`trainer.max_time` as a limit on this call (a resumed run gets it afresh), and the decay it may end (or
    `optim.anneal_time`, a span over the run's calls)."""
    max_time = plan.trainer.get("max_time")
    if max_time is None:
        return []
    timer = CallTimer(duration=max_time)
    optim = plan.config.get("optim") or {}
    if optim.get("anneal_by") != "max_time":
        return [timer]
    span = optim.get("anneal_time")
    return [timer, AnnealByTime(timer, None if span is None else duration_seconds(span))]


def fit(plan: TrainingPlan, module: L.LightningModule, datamodule: L.LightningDataModule, output_dir: Path,
        banner: str, on_start: Callable[[], None] | None = None) -> tuple[L.Trainer, float]:
    """Check a resume, call `on_start`, build the trainer (checkpoints, loggers), print `banner`, fit: returns
    the trainer and the seconds of training over every call of the run (`calls.jsonl`; on other ranks than 0,
    this call's)."""
    check_resume(plan, module)
    if on_start is not None:
        on_start()
    interval = plan.trainer.get("val_check_interval")
    every = plan.run.checkpoint_every
    checkpoints = RunCheckpoints(output_dir / "checkpoints", keep_every=every is not None,
                                 every=every or (interval if isinstance(interval, int) else None))
    validations = ValidationLosses()
    callbacks: list[Callback] = [LogAtGlobalStep(), BatchesFromGlobalStep(), checkpoints, validations]
    shown = plan.trainer.get("enable_progress_bar", True)
    if shown:
        callbacks.append(progress_callback())
    try:
        loggers = _loggers(plan, output_dir)
        if loggers:  # logger=none: Lightning refuses a learning-rate monitor with nothing to write to
            callbacks += [LearningRateMonitor(logging_interval="step"), StepRate()]
        callbacks += _time_limit(plan)
        trainer = build(plan.trainer, "trainer", logger=loggers, callbacks=callbacks, default_root_dir=str(output_dir),
                        max_time=None, enable_progress_bar=shown and on_terminal(sys.stdout))  # else lines
        head, *rest = banner.split("\n")
        print("\n".join([f"{head} | output: {output_dir}", *rest]))
        started = time.perf_counter()
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=plan.run.ckpt_path)
        except (KeyboardInterrupt, SystemExit):  # Lightning exits on Ctrl-C and SIGTERM after saving last.ckpt
            if trainer.interrupted and trainer.is_global_zero and checkpoints.saved_step:
                print(f"interrupted at step {trainer.global_step}; last.ckpt holds step {checkpoints.saved_step}; "
                      f"resume with: python train.py ckpt_path={output_dir}", file=sys.stderr)
            raise
        finally:
            seconds = time.perf_counter() - started
            if trainer.is_global_zero:  # every call's time, finished or not (scripts/training_report.py adds them)
                append_record(output_dir / CALLS_FILE, {"seconds": seconds, "global_step": trainer.global_step,
                                                        **validations.record()})
        return trainer, RunHistory.read(output_dir).seconds if trainer.is_global_zero else seconds
    except MisconfigurationException as error:
        raise ConfigError(f"trainer: {error}") from None
    finally:
        _finish_wandb()


def costs(task: PuzzleTask, run: RunConfig, data: DataConfig, steps: int | None, sampler: str) -> list[str]:
    """What a run will do beside training, said before it starts: the data it makes (and how much of it the run
    reads) and the evaluation after it, each with the setting that makes it smaller."""
    lines = []
    if not task.cache_path().exists():
        line = (f"data: making {task.n_train + task.n_val + task.n_test:,} {task.name} examples (train "
                f"{task.n_train:,}, val {task.n_val:,}, test {task.n_test:,}) once, cached in {task.cache_path()}")
        if steps is not None and (reads := steps * data.batch_size) < task.n_train:
            line += (f"; {steps} steps x {data.batch_size} read {reads:,} training examples per process "
                     f"(task.n_train={reads} makes no more)")
        lines.append(line)
    if run.evaluate_after_training and steps is not None:
        size = "the examples of task.test_file" if task.test_file else \
            f"{min(run.eval_limit or task.n_test, task.n_test):,} test examples"
        lines.append(f"after training: {sampler} on {size} (eval_limit=N for fewer, evaluate_after_training=false "
                     "for none)")
    return lines


def run_training(plan: TrainingPlan, output_dir: Path, on_start: Callable[[], None] | None = None,
                 module_class: type[MDMModule] = MDMModule) -> dict[str, Any]:
    """Train, save `model.pt`, evaluate the test split; `on_start` runs once every check has passed.
    `module_class`: what trains the parts (an RL run's trains by rollouts and rewards)."""
    config, run, data = plan.config, plan.run, plan.data
    seed_run(run)
    module = module_class(config, plan.mdm_parts, run)
    if run.init_from is not None and run.ckpt_path is None:  # a resume restores its own weights
        start_from(module, run.init_from)
    datamodule = PuzzleDataModule(module.task, data.batch_size, data.eval_batch_size, data.val_examples, run.seed,
                                  data.augment, data.workers)
    banner = f"model: {module.network.num_parameters() / 1e6:.2f}M parameters | task: {module.task.name}"
    if datamodule.augment:
        banner += f" | augmented by {module.task.symmetries}"
    evaluation = {"kind": "train", "sampler": config["sampler"], "preset": plan.preset}
    evaluation["family"] = derive_family(evaluation)
    steps = None if plan.trainer.get("fast_dev_run") else plan.trainer["max_steps"]
    banner = "\n".join([banner, *plan.notes, *costs(module.task, run, data, steps, row_label(evaluation))])
    trainer, train_time = fit(plan, module, datamodule, output_dir, banner, on_start)
    summary: dict[str, Any] = {"train_time_s": train_time, "global_step": trainer.global_step}
    if trainer.global_rank != 0:
        return summary

    save_slim(module.config, module.ema.shadow, output_dir / "model.pt", extra={"train_summary": summary},
              dtype=getattr(torch, run.save_dtype))
    if run.evaluate_after_training and not ran_fast_dev_run(trainer):
        network = module.network.to(resolve_device(run.device))
        with module.ema.swapped_in(network):
            sampler = build_sampler(config["sampler"], network)
            result = evaluate_test_split(network, module.task, sampler, run.eval_limit, data.eval_batch_size, run.seed)
        summary.update(result.summary())
        row = {**evaluation, "checkpoint": str(output_dir / "model.pt"), "weights": "ema", "task": module.task.name}
        append_record(run.results_file, {**row, **summary, "config": config})
        print(f"[{module.task.name}] trained {trainer.global_step} steps in {train_time / 60:.1f} min | "
              f"{row_label(row)}: {format_summary(result.summary())}")
    return summary

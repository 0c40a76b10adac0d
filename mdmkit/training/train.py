"""`train.py experiment=...`: train a masked diffusion model, then evaluate it on the test split."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig

from mdmkit.core.config import build, require, to_container
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.evaluation.evaluate import evaluate_test_split, format_summary
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.io.checkpoint import TrainedModel, save_slim
from mdmkit.io.results import append_record
from mdmkit.training.datamodule import PuzzleDataModule
from mdmkit.training.module import MDMModule


def _loggers(cfg: DictConfig, output_dir: Path) -> list[Any]:
    loggers = []
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        loggers.append(build(node, f"logger.{name}", save_dir=str(output_dir)))
    return loggers


def _finish_wandb() -> None:
    """Close a wandb run even when training failed, so one broken job never breaks a multirun."""
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except ImportError:
        pass


def prepare_run(cfg: DictConfig) -> None:
    """Checks every training run shares, then seeds it: a bad value stops before anything is built."""
    if cfg.ckpt_path is not None and not Path(cfg.ckpt_path).expanduser().is_file():
        raise CheckpointError(f"ckpt_path not found: {cfg.ckpt_path}")
    data = cfg.data
    require(data.batch_size >= 1 and data.eval_batch_size >= 1, "data.batch_size and data.eval_batch_size must be >= 1")
    require(data.val_examples >= 1, f"data.val_examples={data.val_examples} must be >= 1")
    L.seed_everything(cfg.seed, workers=True, verbose=False)


def fit(cfg: DictConfig, module: L.LightningModule, datamodule: L.LightningDataModule, output_dir: Path,
        banner: str) -> tuple[L.Trainer, float]:
    """Build the trainer (checkpoints, loggers), print `banner`, fit: returns the trainer and the seconds."""
    checkpoints = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="step{step:07d}",  # no '=' in file names: they must pass as Hydra overrides (ckpt_path=...)
        auto_insert_metric_name=False,
        save_last=True,
        save_top_k=0 if cfg.checkpoint_every is None else -1,
        every_n_train_steps=cfg.checkpoint_every,
    )
    callbacks = [checkpoints, LearningRateMonitor(logging_interval="step")]
    try:
        trainer = build(cfg.trainer, "trainer", logger=_loggers(cfg, output_dir), callbacks=callbacks,
                        default_root_dir=str(output_dir))
        print(f"{banner} | output: {output_dir}")
        started = time.perf_counter()
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
        return trainer, time.perf_counter() - started
    except MisconfigurationException as error:
        raise ConfigError(f"trainer: {error}") from None
    finally:
        _finish_wandb()


def run_training(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    config = to_container(cfg)
    prepare_run(cfg)
    data = cfg.data
    module = MDMModule(config)
    if cfg.get("init_from") is not None:  # fine-tuning: start from a trained model's (EMA) weights
        module.start_from(TrainedModel(cfg.init_from).network(module.task))
    build_sampler(to_container(cfg.sampler))  # checked now: a bad value must not wait for the end of training
    datamodule = PuzzleDataModule(module.task, data.batch_size, data.eval_batch_size, data.val_examples, cfg.seed)
    banner = f"model: {module.network.num_parameters() / 1e6:.2f}M parameters | task: {module.task.name}"
    trainer, train_time = fit(cfg, module, datamodule, output_dir, banner)
    summary: dict[str, Any] = {"train_time_s": train_time, "global_step": trainer.global_step}
    if trainer.global_rank != 0:
        return summary

    save_slim(module.config, module.ema.shadow, output_dir / "model.pt", extra={"train_summary": summary})
    if cfg.evaluate_after_training and not trainer.fast_dev_run:
        network = module.network.to(resolve_device(cfg.device))
        with module.ema.swapped_in(network):
            sampler = build_sampler(to_container(cfg.sampler), network)
            result = evaluate_test_split(network, module.task, sampler, cfg.eval_limit, data.eval_batch_size, cfg.seed)
        summary.update(result.summary())
        append_record(cfg.results_file, {"kind": "train", "checkpoint": str(output_dir / "model.pt"),
                                         "weights": "ema", "task": module.task.name,
                                         "sampler": to_container(cfg.sampler), **summary, "config": config})
        print(f"[{module.task.name}] trained {trainer.global_step} steps in {train_time / 60:.1f} min | "
              f"{format_summary(result.summary())}")
    return summary

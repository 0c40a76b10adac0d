"""Checks of a training config that run before Lightning is imported: a bad value stops at once.

`check_run` needs nothing heavy; `check_components` builds every configured part that needs no weights (task,
model spec, objective, optimizer, samplers), which imports torch but still not Lightning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mdmkit.core.config import build, duration_seconds, require
from mdmkit.core.errors import CheckpointError
from mdmkit.io.results import check_writable
from mdmkit.training.run_config import DataConfig, RunConfig


def check_run(cfg: DictConfig) -> RunConfig:
    """Values every training run shares (files it starts from, step counts, the run and data settings): the run
    settings, checked."""
    run = RunConfig.from_config(cfg)
    for option in ("ckpt_path", "init_from") if run.ckpt_path is None else ("ckpt_path",):
        path = getattr(run, option)  # a resume restores its weights: the model it was fine-tuned from may be gone
        if path is not None and Path(path).expanduser().is_dir():  # a run directory resumes outside a multirun
            raise CheckpointError(f"{option}={path} is a directory: name a checkpoint file in it")
        if path is not None and not Path(path).expanduser().is_file():
            raise CheckpointError(f"{option} not found: {path}")
    trainer = cfg.get("trainer") or {}
    steps = trainer.get("max_steps")
    if not trainer.get("fast_dev_run"):
        require(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1,
                f"trainer: max_steps={steps} must be an integer >= 1 (the steps to train, and the length of the "
                "learning-rate schedule)")
    max_time = trainer.get("max_time")
    require(max_time is None or isinstance(max_time, (dict, DictConfig))
            or duration_seconds(max_time) is not None,
            f"trainer: max_time={max_time} must be \"DD:HH:MM:SS\" (e.g. '00:00:09:30') or a dict of timedelta units")
    anneal_by = (cfg.get("optim") or {}).get("anneal_by")
    require(anneal_by != "max_time" or max_time is not None,
            "optim.anneal_by=max_time needs trainer.max_time (the time the decay ends by)")
    data = DataConfig.from_config(cfg.data)
    require(not (data.augment and cfg.get("indicator") is not None),
            "data.augment=true: an indicator trains on recorded trajectories, which it cannot augment")
    if run.evaluate_after_training:
        check_writable(run.results_file)  # the row of the test evaluation comes after all of training
    return run


def check_components(config: dict[str, Any]) -> None:
    """Build what an MDM run's config names, short of allocating the network: each raises its one-line error."""
    from mdmkit.evaluation.resolve import build_sampler
    from mdmkit.io.checkpoint import build_model_spec, build_task

    task = build_task(config)
    require(not DataConfig.from_config(config["data"]).augment or task.symmetries is not None,
            f"data.augment=true: task {task.name} defines no symmetries to draw from (Sudoku and maze do)")
    spec = build_model_spec(config, task)
    objective = build(config["objective"], "objective")
    wanted = getattr(objective, "model_spec", None)  # an objective that trains one kind of network only
    require(wanted is None or isinstance(spec, wanted),
            f"objective {type(objective).__name__} trains a {getattr(wanted, '__name__', '')} network, not the "
            f"{type(spec).__name__} of this model: pick model=speculative_* (conf/model/)")
    require(not getattr(spec, "freeze_noncausal", False) or config.get("init_from") or config.get("ckpt_path"),
            "model.freeze_noncausal=true trains the causal head on a frozen trunk: give the trained MDM to start "
            "from (init_from=<mdm.pt>), else the trunk stays random")
    build(config["optim"], "optim")
    build_sampler(config["sampler"])  # before val_sampler, which is ${sampler} unless set: name what was typed
    build(config["val_sampler"], "val_sampler")

"""A training run's plan: its config read once and checked before Lightning is imported (a bad value stops at once).

`plan_training` makes the `TrainingPlan` the run functions take. `check_run` needs nothing heavy; `build_parts`
builds, once, every configured part of an MDM run that needs no weights (task, model spec, objective, optimizer,
samplers), which imports torch but still not Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omegaconf import DictConfig

from mdmkit.core.config import build, duration_seconds, require, require_given, to_container
from mdmkit.core.errors import CheckpointError
from mdmkit.io.results import check_writable
from mdmkit.training.run_config import DataConfig, RunConfig

if TYPE_CHECKING:
    from mdmkit.tasks.base import PuzzleTask
    from mdmkit.training.optim import OptimConfig
    from mdmkit.training.rl.config import RLConfig
    from mdmkit.training.sft.config import SFTConfig, SFTParts


@dataclass(frozen=True)
class MDMParts:
    """What an MDM run's config names, built and checked once: the module trains with them and the test evaluation
    decodes with `sampler`. `model` is the network's spec sized for `task` (no weights yet); the samplers are built
    without their checkpoints (a planner's or indicator's weights load for the trained network)."""

    task: PuzzleTask
    model: Any
    objective: Any
    optim: OptimConfig
    sampler: Any
    val_sampler: Any


@dataclass(frozen=True)
class RLParts(MDMParts):
    """An RL run's parts: an MDM run's (it validates and is evaluated as one) and its RL settings (`rl`)."""

    rl: RLConfig


@dataclass(frozen=True)
class TrainingPlan:
    """What a training run is, read once. `kind` picks the run: an MDM ("mdm"), an NI indicator on a frozen base
    MDM ("indicator", experiment=*_indicator), the fine-tuning of a pretrained diffusion LLM ("sft",
    experiment=*_sft) or RL on an MDM ("rl", experiment=*_rl; its `RLParts` are `MDMParts` with the RL settings).
    `config` is the resolved config, as checkpoints keep it and result rows record it. `run`
    and `data` are its settings, typed and checked; `parts` what its config names, built once (an MDM run's
    `MDMParts`, a fine-tuning run's `SFTParts`; an indicator run builds its own). `preset`: the `sampler=` option
    the run was composed with (the CLI reads it from Hydra), named in the row of the test evaluation. `notes`: what
    the banner says the run will read and evaluate, found by the checks."""

    kind: Literal["mdm", "indicator", "sft", "rl"]
    config: dict[str, Any]
    run: RunConfig
    data: DataConfig
    parts: MDMParts | SFTParts | None = None
    preset: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def sft(self) -> SFTConfig | None:
        """A fine-tuning run's settings."""
        return self.sft_parts.sft if self.kind == "sft" else None

    @property
    def sft_parts(self) -> SFTParts:
        from mdmkit.training.sft.config import SFTParts

        assert isinstance(self.parts, SFTParts), "a fine-tuning run's plan holds its parts"
        return self.parts

    @property
    def mdm_parts(self) -> MDMParts:
        assert isinstance(self.parts, MDMParts), "an MDM run's plan holds its parts"
        return self.parts

    @property
    def trainer(self) -> dict[str, Any]:
        """The Lightning Trainer's node (conf/trainer/)."""
        return self.config.get("trainer") or {}


def plan_training(cfg: DictConfig, preset: str | None = None) -> TrainingPlan:
    """The plan of the run `cfg` configures, after every check that needs no weights (one line each): a value left
    `???`, the trainer against the devices present (its `precision: auto` resolved in the plan's config), then
    each kind's own."""
    from mdmkit.training.accelerator import resolve_trainer

    require_given(cfg)
    config = to_container(cfg)
    run, data = check_run(config)
    if config.get("trainer"):
        config["trainer"] = resolve_trainer(config["trainer"])
    indicator = config.get("indicator") is not None
    if indicator or run.evaluate_after_training:
        from mdmkit.core.devices import resolve_device

        resolve_device(run.device)  # device=cuda without CUDA: one line now, not after training
    if indicator:
        return TrainingPlan("indicator", config, run, data, preset=preset)
    if config.get("rl") is not None and config.get("sft") is not None:  # RL on a pretrained diffusion LLM
        from mdmkit.training.rl.plan import plan_text_rl

        text_parts, notes = plan_text_rl(config, run, data, preset)
        return TrainingPlan("rl", config, run, data, text_parts, preset, notes)
    if config.get("sft") is not None:
        from mdmkit.training.sft.preflight import plan_sft

        sft = plan_sft(config, run, data, preset)
        return TrainingPlan("sft", config, run, data, sft.parts, preset, sft.notes)
    if config.get("rl") is not None:
        from mdmkit.training.rl.plan import plan_rl

        mdm = build_parts(config, data)
        settings, notes = plan_rl(config, data)
        return TrainingPlan("rl", config, run, data, RLParts(**vars(mdm), rl=settings), preset, notes)
    return TrainingPlan("mdm", config, run, data, build_parts(config, data), preset)


def check_run(cfg: DictConfig | dict[str, Any]) -> tuple[RunConfig, DataConfig]:
    """Values every training run shares (files it starts from, step counts, the run and data settings): the run
    and data settings, checked."""
    config = to_container(cfg)
    run = RunConfig.from_config(config)
    for option in ("ckpt_path", "init_from") if run.ckpt_path is None else ("ckpt_path",):
        path = getattr(run, option)  # a resume restores its weights: the model it was fine-tuned from may be gone
        if path is not None and Path(path).expanduser().is_dir():  # a run directory resumes outside a multirun
            raise CheckpointError(f"{option}={path} is a directory: name a checkpoint file in it")
        if path is not None and not Path(path).expanduser().is_file():
            raise CheckpointError(f"{option} not found: {path}")
    trainer = config.get("trainer") or {}
    steps = trainer.get("max_steps")
    if not trainer.get("fast_dev_run"):
        require(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1,
                f"trainer: max_steps={steps} must be an integer >= 1 (the steps to train, and the length of the "
                "learning-rate schedule)")
    max_time = trainer.get("max_time")
    require(max_time is None or isinstance(max_time, dict) or duration_seconds(max_time) is not None,
            f"trainer: max_time={max_time} must be \"DD:HH:MM:SS\" (e.g. '00:00:09:30') or a dict of timedelta units")
    anneal_by = (config.get("optim") or {}).get("anneal_by")
    require(anneal_by != "max_time" or max_time is not None,
            "optim.anneal_by=max_time needs trainer.max_time (the time the decay ends by)")
    data = DataConfig.from_config(config["data"])
    require(not (data.augment and config.get("indicator") is not None),
            "data.augment=true: an indicator trains on recorded trajectories, which it cannot augment")
    if run.evaluate_after_training:
        check_writable(run.results_file)  # the row of the test evaluation comes after all of training
    return run, data


def build_parts(config: dict[str, Any], data: DataConfig) -> MDMParts:
    """Build what an MDM run's config names, short of allocating the network: each raises its one-line error.
    `data`: the run's data settings (check_run's)."""
    from mdmkit.evaluation.generation import check_trained_for
    from mdmkit.evaluation.resolve import build_sampler
    from mdmkit.io.checkpoint import build_model_spec, build_task

    task = build_task(config)
    require(not data.augment or task.symmetries is not None,
            f"data.augment=true: task {task.name} defines no symmetries to draw from (Sudoku and maze do)")
    spec = build_model_spec(config, task)
    objective = build(config["objective"], "objective")
    wanted = getattr(objective, "model_spec", None)  # an objective that trains one kind of network only
    require(wanted is None or isinstance(spec, wanted),
            f"objective {type(objective).__name__} trains a {getattr(wanted, '__name__', '')} network, not the "
            f"{type(spec).__name__} of this model: pick model=speculative_* (conf/model/)")
    require(not getattr(spec, "freeze_noncausal", False) or bool(config.get("init_from") or config.get("ckpt_path")),
            "model.freeze_noncausal=true trains the causal head on a frozen trunk: give the trained MDM to start "
            "from (init_from=<mdm.pt>), else the trunk stays random")
    optim = build(config["optim"], "optim")
    sampler = build_sampler(config["sampler"])  # before val_sampler (${sampler} unless set): name what was typed
    val_sampler = build(config["val_sampler"], "val_sampler")
    check_trained_for(str(config["objective"].get("_target_", "")), sampler)  # a sampler of the objective's kind
    return MDMParts(task, spec, objective, optim, sampler, val_sampler)

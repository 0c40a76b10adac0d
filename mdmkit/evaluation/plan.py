"""An evaluation run's plan: its config read once and checked before any model loads (a bad value stops at once).

`plan_evaluation` makes the `EvaluationPlan` that `run_evaluation` (evaluate.py) takes: the measurement settings
typed, every sampler of the run validated, the task built and, for a text task, the model's loading settings.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mdmkit.core.config import build, option, require, require_bool, require_int, to_container
from mdmkit.core.devices import resolve_device
from mdmkit.evaluation.generation import check_decoder
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.sweep import SweepJob, expand
from mdmkit.io.results import check_writable
from mdmkit.models.llm.registry import ModelKind, model_kind
from mdmkit.tasks.base import PuzzleTask
from mdmkit.tasks.text import TextTask


@dataclass(frozen=True)
class EvaluationPlan:
    """What an evaluation run is, read once. `config` is the resolved config, as every row records it.

    `jobs`: the samplers to measure (one, or a sweep's grid), each with the option it came from. `task`: the task
    named by `task=` (None: the checkpoint's own), built from `task_node`; `task_fields`: the `task.*` fields set
    by name on the command line, which alone replace the checkpoint's trained values when `task=` names its own
    task (None: all of `task_node` as given). `hf`: how a text task's `ckpt` loads (None for puzzle tasks).
    """

    config: dict[str, Any]
    ckpt: str
    jobs: tuple[SweepJob, ...]
    task: PuzzleTask | TextTask | None
    task_node: dict[str, Any] | None
    task_fields: frozenset[str] | None
    hf: HFModelConfig | None
    seed: int
    limit: int | None
    batch_size: int
    device: str
    results_file: str
    resume: bool
    sweep_name: str | None  # the sweep's name (`sweep=...`), None for a single sampler
    wandb: dict[str, Any] | None  # where rows are logged (None or mode=disabled: nowhere)


def plan_evaluation(cfg: DictConfig | dict[str, Any], preset: str | None = None,
                    task_fields: Collection[str] | None = None, sampler_named: bool = True) -> EvaluationPlan:
    """The plan of the run `cfg` configures, after every check that needs no model (one line each).

    `preset`: the `sampler=` option a single-sampler run was composed with (the CLI reads it from Hydra), named in
    its row. `task_fields`: see `EvaluationPlan`. `sampler_named`: the command line named a sampler or set one of
    its fields; where it did not, a text task runs the model kind's own default (`ModelKind.default_sampler`), not
    the puzzles' default the config was composed with, following the settings the checkpoint gives itself (its
    kind's `sampler_settings`: one printed line names them)."""
    config = to_container(cfg)
    ckpt = config.get("ckpt")
    require(ckpt is not None, "ckpt=... is required: an mdmkit checkpoint, or for text tasks a Hugging Face "
                              "model directory or hub name")
    require_int("batch_size", config["batch_size"], 1)
    require_int("limit", config["limit"], 1, optional=True)
    require_int("seed", config["seed"], 0)
    require_bool("oracle", config["oracle"])
    require_bool("resume", config["resume"])
    check_writable(config["results_file"])  # rows made by hours of sampling must have somewhere to go
    sweep = config.get("sweep") or None
    jobs = expand(sweep) if sweep else [SweepJob(copy.deepcopy(config["sampler"]), config["oracle"], preset)]
    samplers = [build_sampler(job.sampler) for job in jobs]  # every sampler is valid before the model is loaded
    resolve_device(config["device"])  # device=cuda without CUDA: one line now, not a traceback from the first .to()
    task_node = config.get("task")
    task = build(task_node, "task") if task_node is not None else None
    _check_checkpoint_kind(str(ckpt), task)
    hf, note = None, None
    if isinstance(task, TextTask):
        hf = build({"_target_": "mdmkit.evaluation.hf_config.HFModelConfig", **config["hf"]}, "hf")
        require(task.limit is None, f"task.limit={task.limit}: give limit={task.limit} (the rows record that one)")
        task.limit = config["limit"]
        record = model_kind(hf.kind)
        if not (sweep or sampler_named):  # the kind's default, with the settings the checkpoint gives itself
            preset = record.default_sampler
            fields, note = checkpoint_sampler_fields(record, str(ckpt), given=())
            config["sampler"] = with_fields(option("sampler", preset), fields, preset)
            jobs = [SweepJob(copy.deepcopy(config["sampler"]), config["oracle"], preset)]
            samplers = [build_sampler(jobs[0].sampler)]
        elif not sweep and preset == record.default_sampler:  # named: as it is, saying what the checkpoint sets
            _, note = checkpoint_sampler_fields(record, str(ckpt), given=None)
        if note:
            print(note)
        causal = record.decoding == "causal"  # a causal kind takes sampler=ntp (or sbd): checked now
        for sampler in samplers:
            check_decoder(causal, sampler)
        task.check_can_score()  # the code sandbox's opt-in and isolation: refused now, not after hours of generation
        if hf.adapter is not None:
            _check_adapter_kind(hf.adapter, hf.kind)
    return EvaluationPlan(
        config=config, ckpt=str(ckpt), jobs=tuple(jobs), task=task, task_node=task_node,
        task_fields=None if task_fields is None else frozenset(task_fields), hf=hf, seed=config["seed"],
        limit=config["limit"], batch_size=config["batch_size"], device=str(config["device"]),
        results_file=str(config["results_file"]), resume=config["resume"],
        sweep_name=str(sweep.get("name", "sweep")) if sweep else None, wandb=config.get("wandb") or None)


def checkpoint_sampler_fields(record: ModelKind, ckpt: str,
                              given: Collection[str] | None) -> tuple[dict[str, Any], str | None]:
    """The fields of the kind's default sampler that the model at `ckpt` sets for itself (its record's
    `sampler_settings`, read without the weights) less those the user sets (`given`, dotted; a nested sampler given
    by name takes the checkpoint's fields under it out), and the line naming them. `given` None: the user named the
    default option, which runs as named (nothing is taken; the line names what the checkpoint sets)."""
    settings = {} if record.sampler_settings is None else dict(record.sampler_settings(ckpt))
    if not settings:
        return {}, None
    option_name, listed = f"sampler={record.default_sampler}", _listed(settings)
    if given is None:
        return {}, (f"[mdmkit] {option_name} as named: its preset's settings, not the ones {ckpt} gives itself "
                    f"({listed}), which it follows when no sampler is named")
    taken = {name: value for name, value in settings.items()
             if not any(name == field or name.startswith(f"{field}.") for field in given)}
    yours = {name: value for name, value in settings.items() if name not in taken}
    return taken, (f"[mdmkit] {option_name} ({record.name}'s default) with the settings {ckpt} gives itself: "
                   f"{_listed(taken) or 'none'}" + (f"; yours win over its {_listed(yours)}" if yours else ""))


def _listed(fields: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in fields.items())


def with_fields(config: dict[str, Any], fields: Mapping[str, Any], preset: str) -> dict[str, Any]:
    """Sampler config `config` (of option `preset`) with `fields` set in place, dotted for a nested sampler's."""
    for key, value in fields.items():
        *parents, name = key.split(".")
        node = config
        for parent in parents:
            child = node.get(parent)
            node = child if isinstance(child, dict) else {}
        require(name in node, f"{key}: sampler={preset} has no such field")
        node[name] = value
    return config


def _check_checkpoint_kind(ckpt: str, task: PuzzleTask | TextTask | None) -> None:
    """A model of the other kind than the task takes, named with the fix: text tasks load a Hugging Face model
    directory, puzzle tasks an mdmkit checkpoint file."""
    path = Path(ckpt).expanduser()
    if isinstance(task, TextTask):
        require(not path.is_file(), f"ckpt={ckpt} is a file: task={task.name} loads a Hugging Face model directory "
                                    "or hub name (an mdmkit checkpoint evaluates on its own task: leave out task=)")
    else:
        require(not (path / "config.json").is_file(),
                f"ckpt={ckpt} is a Hugging Face model directory: name a text task and the model's kind, e.g. "
                "task=gsm8k hf.kind=llada")


def _check_adapter_kind(adapter: str, kind: str) -> None:
    """An adapter mdmkit saved records its base's kind (`adapter_base`): one of another kind than `hf.kind` is
    refused now, before the model loads, where merging it would stop at its first tensor of another shape."""
    from mdmkit.models.llm.adapter_base import read_record

    record = read_record(Path(adapter).expanduser()) or {}
    trained_on = record.get("kind")
    require(trained_on in (None, kind), f"hf.adapter={adapter} was trained on a {trained_on} model "
                                        f"({record.get('base') or 'its base'}), not a {kind} one: evaluate it on "
                                        f"that base, ckpt=<its directory> hf.kind={trained_on}")

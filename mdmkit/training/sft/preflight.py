"""Every check of a fine-tuning run that needs no weights, made before the first model or dataset load.

Each failure is one line naming the key and the fix, seconds after the command, where it used to come after the
model had loaded, or after training: the model's positions (its config.json, read through its kind's reader)
against `sft.max_length` and the evaluation's answer budget, the pair files (read: a malformed line stops now),
where the task's splits load from (a local file, or the hub when it can be reached), and whether the evaluation
after training can run. What the run will read and evaluate is said in its banner (`SFTPlan.notes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdmkit.core.config import require
from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.core.wording import plural
from mdmkit.io.naming import derive_family, row_label
from mdmkit.models.llm.checkpoints import read_config
from mdmkit.models.llm.registry import declared_kind
from mdmkit.tasks.text import TextTask
from mdmkit.training.run_config import DataConfig, RunConfig
from mdmkit.training.sft.config import SFTConfig, SFTParts, build_sft_parts
from mdmkit.training.sft.pairs import read_pairs

_NO_EVALUATION = "or evaluate_after_training=false"


@dataclass(frozen=True)
class SFTPlan:
    """A fine-tuning run's parts (settings, text task, loss, optimizer) and the lines its banner says of its data
    and of the evaluation after training."""

    parts: SFTParts
    notes: tuple[str, ...]


def plan_sft(config: dict[str, Any], run: RunConfig, data: DataConfig, preset: str | None = None) -> SFTPlan:
    """Every check of the run `config` configures that needs no weights (`run`, `data`: its checked settings;
    `preset`: the `sampler=` option, named where the evaluation after training is announced)."""
    parts = build_sft_parts(config)
    sft, task = parts.sft, parts.task
    positions = model_positions(sft)
    require(sft.max_length <= positions, f"sft.max_length={sft.max_length} is more than the {positions} positions "
                                         f"of {sft.model}: sft.max_length={positions} (or fewer)")
    notes = [_training_data(sft, task, config, data)]
    if run.evaluate_after_training and not (config.get("trainer") or {}).get("fast_dev_run"):
        notes.append(_evaluation(config, run, sft, task, positions, preset))
    return SFTPlan(parts, tuple(notes))


def model_positions(sft: SFTConfig) -> int:
    """The positions of `sft.model`, from its config.json as its kind reads it (no weights); a checkpoint of
    another kind is refused naming the experiment that fine-tunes it."""
    directory = Path(sft.model).expanduser()
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"sft.model={sft.model}: config.json is not readable JSON ({error})") from None
    declared = declared_kind(raw) if isinstance(raw, dict) else None
    if declared is not None and declared.name != sft.kind:
        raise ConfigError(f"sft.kind={sft.kind}, but {sft.model} is a {declared.name} checkpoint (its config.json's "
                          f"model_type): experiment={declared.name}_sft, or sft.kind={declared.name}")
    try:
        return read_config(directory, sft.kind).max_positions
    except CheckpointError as error:
        raise CheckpointError(f"sft.model={sft.model}: {error}") from None


def _training_data(sft: SFTConfig, task: TextTask | None, config: dict[str, Any], data: DataConfig) -> str:
    """Where the training pairs come from, checked: the pair files read, or the task's training split reachable."""
    if sft.train_file is not None:
        pairs = len(read_pairs(sft.train_file))
        if sft.val_file is not None:
            validation = f"validation on {sft.val_file} ({plural(len(read_pairs(sft.val_file)), 'pair')})"
        else:
            require(pairs >= 2, f"sft.train_file={sft.train_file} holds 1 pair: at least 2 are needed (one held "
                                "out for the validation loss), or give sft.val_file")
            validation = "validation held out of them"
        return f"data: {plural(pairs, 'pair')} from {sft.train_file}, {validation}"
    name = (config.get("task") or {}).get("_target_", "null")
    if task is None:
        raise ConfigError(f"sft.train_file=null takes the pairs from the run's task, which is no text task "
                          f"({name}): give sft.train_file=pairs.jsonl, or task=gsm8k")
    if type(task).reference is TextTask.reference:
        raise ConfigError(f"sft.train_file=null takes the pairs from task={task.name}, which names no reference "
                          "answer to fine-tune on: give the pairs in a JSONL file (sft.train_file)")
    source = task.source_of("train", _local_data(task, "or give your pairs as sft.train_file=pairs.jsonl"))
    validation = "sft.val_file" if sft.val_file is not None else f"the last data.val_examples={data.val_examples}"
    return f"data: {task.name}'s training split from {source}, validation on {validation}"


def _evaluation(config: dict[str, Any], run: RunConfig, sft: SFTConfig, task: TextTask | None, positions: int,
                preset: str | None) -> str:
    """The evaluation after training (the task's test split, with the run's sampler), checked and announced."""
    if task is None:
        name = (config.get("task") or {}).get("_target_", "null")
        raise ConfigError(f"evaluate_after_training=true evaluates on the run's task, which is no text task ({name}): "
                          f"task=gsm8k, {_NO_EVALUATION}")
    task.check_can_score()
    require(task.max_gen_len < positions,
            f"task.max_gen_len={task.max_gen_len}: the evaluation after training generates that many answer tokens, "
            f"which leave no room for a prompt in the {positions} positions of {sft.model}: "
            f"task.max_gen_len={positions // 2} (or fewer), {_NO_EVALUATION}")
    source = task.source_of("test", _local_data(task, _NO_EVALUATION))
    evaluation = {"kind": "sft", "sampler": config["sampler"], "preset": preset}
    label = row_label({**evaluation, "family": derive_family(evaluation)})
    return (f"after training: {label} on {_documents(task, source, run.eval_limit)} from {source} "
            f"(eval_limit=N for fewer, evaluate_after_training=false for none)")


def _local_data(task: TextTask, alternative: str) -> str:
    """The fix for a split that cannot load: a local copy of the benchmark's files, or `alternative`."""
    return f"point task.data_dir at a directory with {', '.join(sorted(task.source.local_files.values()))}, " \
           f"{alternative}"


def _documents(task: TextTask, source: str, limit: int | None) -> str:
    """How many test documents the evaluation reads: counted in a local JSONL file (a task that splits one file
    itself is not counted), else as `eval_limit` bounds them."""
    if source.endswith(".jsonl") and type(task).post_filter is TextTask.post_filter:
        with open(source, encoding="utf-8") as handle:
            total = sum(1 for line in handle if line.strip())
        shown = total if limit is None else min(limit, total)
        return f"{shown:,} of the {plural(total, f'{task.name} test document')}"
    return f"the first {plural(limit, f'{task.name} test document')}" if limit is not None else \
        f"every {task.name} test document"


"""Checkpoint I/O: Lightning checkpoints for resuming, slim `model.pt` files (config + EMA weights) for use.

Both carry the resolved run config, so a checkpoint alone rebuilds its network and task.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from mdmkit.core.config import build
from mdmkit.core.errors import CheckpointError
from mdmkit.io.indicator import FORMAT as INDICATOR_FORMAT
from mdmkit.models import MaskedTransformer
from mdmkit.tasks.base import PuzzleTask

EMA_PREFIX = "ema.shadow."
MACHINE_TASK_FIELDS = ("cache_dir", "workers")  # where and how fast data are made, not what the network is


def _read(path: Path, mmap: bool = False) -> dict[str, Any]:
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory: name a checkpoint file (model.pt, a .ckpt) in it")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            state = torch.load(path, map_location="cpu", weights_only=False)  # the legacy format cannot be mapped
    except Exception as error:  # noqa: BLE001 (a truncated or foreign file: one line, not a traceback)
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not an mdmkit checkpoint (a saved {type(state).__name__}, not a dict)")
    return state


def _plain(value: Any) -> Any:
    """Lists for tuples, so a YAML list and a saved tuple compare equal."""
    return list(value) if isinstance(value, tuple) else value


def build_task(config: dict[str, Any]) -> PuzzleTask:
    """The task of a resolved run config."""
    return build(config["task"], "task")


def build_model_spec(config: dict[str, Any], task: PuzzleTask) -> Any:
    """The validated model spec of a resolved run config, sized for `task` (no weights allocated yet)."""
    return build(config["model"], "model", vocab_size=task.vocab_size, max_len=task.seq_len)


def build_network(config: dict[str, Any], task: PuzzleTask) -> MaskedTransformer:
    """The (untrained) network of a resolved run config, sized for `task`."""
    return build_model_spec(config, task).build()


def _leaves(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}.{key}").items()}
    return {prefix: node}


def config_differences(saved: dict[str, Any], current: dict[str, Any],
                       sections: tuple[str, ...] = ("model", "task")) -> list[str]:
    """`key=saved (this run: current)` for every field of `sections` in which two run configs differ."""
    ignored = tuple(f"task.{field}" for field in MACHINE_TASK_FIELDS)
    differences = []
    for section in sections:
        old, new = _leaves(saved.get(section), section), _leaves(current.get(section), section)
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in ignored and old.get(key, "(absent)") != new.get(key, "(absent)"):
                differences.append(f"{key}={old.get(key, '(absent)')} (this run: {new.get(key, '(absent)')})")
    return differences


def architecture_error(option: str, path: Path | str, saved: dict[str, Any], current: dict[str, Any],
                       detail: str) -> CheckpointError:
    """One line for weights that do not fit this run's network: the fields of the trained networks that differ
    (`model`, an NI run's `indicator`), else the task's (which size the embedding), else `detail`."""
    differences = (config_differences(saved, current, ("model", "indicator"))
                   or config_differences(saved, current, ("task",)))
    what = ", ".join(differences) if differences else detail
    return CheckpointError(f"{option}={path} holds another architecture than this run's config: {what}")


def read_lightning_checkpoint(path: Path | str) -> dict[str, Any]:
    """A Lightning checkpoint, memory-mapped (cheap to look at before Lightning loads it for real)."""
    path = Path(path).expanduser()
    raw = _read(path, mmap=True)
    if "state_dict" not in raw or "global_step" not in raw:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (model.pt files start a run with init_from=)")
    return raw


def shape_mismatch(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> str | None:
    """The first difference between two state dicts' names and shapes, or None when they fit."""
    for name in [*expected, *(k for k in found if k not in expected)]:
        if name not in found:
            return f"missing {name}"
        if name not in expected:
            return f"unexpected {name}"
        if tuple(expected[name].shape) != tuple(found[name].shape):
            return f"{name} has shape {tuple(found[name].shape)}, this run's {tuple(expected[name].shape)}"
    return None


def save_slim(config: dict[str, Any], ema_shadow: torch.nn.ParameterDict | dict[str, torch.Tensor], path: Path,
              extra: dict[str, Any] | None = None, dtype: torch.dtype = torch.float32) -> None:
    """Write config + EMA weights only (a few MB), the file evaluation and later work start from; `dtype`
    bfloat16 halves it (loading widens the weights back to the network's float32)."""
    weights = {name.replace("__", "."): p.detach().to(dtype).cpu() for name, p in ema_shadow.items()}
    payload = {"format": "mdmkit-slim-v1", "config": config, "network": weights, "weights": "ema"}
    payload.update(extra or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


class TrainedModel:
    """A network restored from either checkpoint kind, with its training config and task."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        raw = _read(self.path)
        run_config = (raw.get("hyper_parameters") or {}).get("config") or {}
        if raw.get("format") == INDICATOR_FORMAT or run_config.get("indicator") is not None:
            raise CheckpointError(f"{self.path} is an NI indicator, not a model (an indicator is given as "
                                  "sampler.indicator=, beside its base model)")
        if raw.get("format") == "mdmkit-slim-v1":
            self.config, self.weights = raw["config"], raw["network"]
        elif run_config:
            self.config = run_config
            self.weights = {k.removeprefix(EMA_PREFIX).replace("__", "."): v for k, v in raw["state_dict"].items()
                            if k.startswith(EMA_PREFIX)}
        else:
            raise CheckpointError(f"{self.path}: not an mdmkit checkpoint (no run config inside)")
        # where and how fast data are made belong to this machine, not to the model: never reuse the trainer's
        task = {key: value for key, value in self.config["task"].items() if key not in MACHINE_TASK_FIELDS}
        self.task = build_task({**self.config, "task": task})

    def task_for(self, given: dict[str, Any], explicit: Collection[str] | None = None) -> tuple[PuzzleTask, list[str]]:
        """The task a run names (`evaluate.py task=maze ...`), and `field=value` for each field it takes from here.

        For this checkpoint's own task class every field keeps its trained value (a `task=maze` option resets
        `answer`, `n_train`, ... to the option's defaults otherwise) except the `explicit` ones, set by name
        (`task.answer=path`, `task.test_file=...`), and where data are made (cache_dir, workers). Another task
        class (same vocabulary) is taken as given, and so is everything when `explicit` is None."""
        trained = self.config["task"]
        if explicit is None or given.get("_target_") != trained.get("_target_"):
            return build_task({**self.config, "task": given}), []
        own = set(explicit) | set(MACHINE_TASK_FIELDS)
        config = {**trained, **{k: v for k, v in given.items() if k in own}}
        kept = [f"{k}={_plain(trained[k])}" for k in trained
                if k not in own and k != "_target_" and _plain(given.get(k)) != _plain(trained[k])]
        return build_task({**self.config, "task": config}), kept

    def network(self, task: PuzzleTask | None = None) -> MaskedTransformer:
        """The EMA network; `task` (if given) must share the trained task's vocabulary and length."""
        if task is not None and (task.vocab, task.seq_len) != (self.task.vocab, self.task.seq_len):
            raise CheckpointError(
                f"{self.path} was trained on task '{self.task.name}' (vocab {self.task.vocab_size}, length "
                f"{self.task.seq_len}); task '{task.name}' needs vocab {task.vocab_size}, length {task.seq_len}"
            )
        network = build_network(self.config, self.task)
        try:
            network.load_state_dict(self.weights)
        except RuntimeError as error:
            first = str(error).strip().splitlines()[-1].strip()
            raise CheckpointError(f"{self.path}: weights do not fit the model config: {first}") from None
        return network.eval()

"""Checkpoint I/O: Lightning checkpoints for resuming, slim `model.pt` files (config + EMA weights) for use.

Both carry the resolved run config, so a checkpoint alone rebuilds its network and task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mdmkit.core.config import build
from mdmkit.core.errors import CheckpointError
from mdmkit.models import MaskedTransformer
from mdmkit.tasks.base import PuzzleTask

EMA_PREFIX = "ema.shadow."


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or foreign file: one line, not a pickle traceback
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None


def build_task(config: dict[str, Any]) -> PuzzleTask:
    """The task of a resolved run config."""
    return build(config["task"], "task")


def build_network(config: dict[str, Any], task: PuzzleTask) -> MaskedTransformer:
    """The (untrained) network of a resolved run config, sized for `task`."""
    spec = build(config["model"], "model", vocab_size=task.vocab_size, max_len=task.seq_len)
    return spec.build()


def save_slim(config: dict[str, Any], ema_shadow: dict[str, torch.Tensor], path: Path,
              extra: dict[str, Any] | None = None) -> None:
    """Write config + EMA weights only (a few MB), the file evaluation and later work start from."""
    weights = {name.replace("__", "."): p.detach().cpu() for name, p in ema_shadow.items()}
    payload = {"format": "mdmkit-slim-v1", "config": config, "network": weights, "weights": "ema"}
    payload.update(extra or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


class TrainedModel:
    """A network restored from either checkpoint kind, with its training config and task."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        raw = _read(self.path)
        if raw.get("format") == "mdmkit-slim-v1":
            self.config, weights = raw["config"], raw["network"]
        elif "hyper_parameters" in raw and "config" in raw["hyper_parameters"]:
            self.config = raw["hyper_parameters"]["config"]
            state = raw["state_dict"]
            weights = {k[len(EMA_PREFIX) :].replace("__", "."): v for k, v in state.items() if k.startswith(EMA_PREFIX)}
        else:
            raise CheckpointError(f"{self.path}: not an mdmkit checkpoint (no run config inside)")
        self.weights = weights
        # the data cache is a property of this machine, not of the model: never reuse the trainer's path
        task = {**self.config["task"], "cache_dir": os.environ.get("MDMKIT_CACHE_DIR", "~/.cache/mdmkit")}
        self.task = build_task({**self.config, "task": task})

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

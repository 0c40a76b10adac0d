"""A training run's own settings (conf/train.yaml's top level and its `data` node) as validated dataclasses.

Light: the CLI checks them before importing Lightning, and Hydra composes them (mdmkit/core/schema.py) without
torch. Their defaults are stated here only: conf/train.yaml extends them as `schema/run` and `schema/data`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from mdmkit.core.config import Validated, require, to_container
from mdmkit.core.errors import ConfigError

SAVE_DTYPES = ("float32", "bfloat16")  # weights of model.pt
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile(mode=)

Settings = TypeVar("Settings", bound=Validated)


def _field_names(cls: type) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def _built(cls: type[Settings], values: dict[str, Any], where: str) -> Settings:
    try:
        return cls(**values)
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None


@dataclass
class DataConfig(Validated):
    """How training and validation batches are made.

    `val_examples`: the fixed validation subset `val_sampler` samples. `augment`: each training example under a
    fresh random symmetry of its task (Sudoku and maze have them). `workers`: processes making training batches
    beside training (0: in it); the batches are the same either way.
    """

    batch_size: int = 64
    eval_batch_size: int = 256
    val_examples: int = 256
    augment: bool = False
    workers: int = 0

    def validate(self) -> None:
        for name in ("batch_size", "eval_batch_size", "val_examples"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        require(self.workers >= 0, f"workers={self.workers} must be >= 0")

    @classmethod
    def from_config(cls, node: Any) -> DataConfig:
        """The run's `data` node as settings: unknown keys, types and ranges refused in one line each."""
        values = to_container(node)
        unknown = sorted(set(values) - set(_field_names(cls)))
        require(not unknown, f"data: unknown key(s) {unknown} (valid: {', '.join(sorted(_field_names(cls)))})")
        return _built(cls, values, "data: ")


@dataclass
class RunConfig(Validated):
    """The top-level settings of a training run (the config groups are checked where they are built).

    `init_from`: fine-tune from a trained model.pt / .ckpt (same architecture; a mismatch names the fields).
    `ckpt_path`: resume from a checkpoint, or its run directory (outputs/<run_name>/<time>): the run goes on in that
    directory and wandb run with its saved config, the overrides given now on top (resolved by the CLI).
    `checkpoint_every`: also keep a checkpoint every N steps (last.ckpt: every N steps, else at each validation).
    `compile`: torch.compile the training steps, true or a mode (e.g. reduce-overhead). `save_dtype`: the EMA
    weights of model.pt, float32 or bfloat16 (half the size). `device`, `eval_limit` (the first N test examples;
    None: all), `results_file`: the test evaluation after training.
    """

    run_name: str = "quickstart"
    seed: int = 0
    init_from: str | None = None
    ckpt_path: str | None = None
    checkpoint_every: int | None = None
    ema_decay: float = 0.999
    compile: bool | str = False
    save_dtype: str = "float32"
    device: str = "auto"
    evaluate_after_training: bool = True
    eval_limit: int | None = None
    results_file: str = "results/evaluations.jsonl"

    def validate(self) -> None:
        require(self.seed >= 0, f"seed={self.seed} must be >= 0")
        for name in ("checkpoint_every", "eval_limit"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"{name}={value} must be >= 1 or null")
        require(0.0 <= self.ema_decay < 1.0, f"ema_decay={self.ema_decay} must lie in [0, 1)")
        require(isinstance(self.compile, bool) or self.compile in COMPILE_MODES,
                f"compile={self.compile} must be true, false or a torch.compile mode ({', '.join(COMPILE_MODES)})")
        require(self.save_dtype in SAVE_DTYPES, f"save_dtype={self.save_dtype} must be one of {', '.join(SAVE_DTYPES)}")

    @classmethod
    def from_config(cls, cfg: Any) -> RunConfig:
        """The run's top-level settings (its groups left out), with types and ranges checked."""
        values = to_container(cfg)
        return _built(cls, {name: values[name] for name in _field_names(cls) if name in values}, "")

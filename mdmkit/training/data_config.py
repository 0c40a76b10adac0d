"""The `data` settings of a training run (light: the CLI validates them before importing Lightning)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mdmkit.core.config import Validated, require, to_container
from mdmkit.core.errors import ConfigError


@dataclass
class DataConfig(Validated):
    """How training and validation batches are made (conf/train.yaml's `data` states these defaults).

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
        valid = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(valid))
        try:
            require(not unknown, f"unknown key(s) {unknown} (valid: {', '.join(sorted(valid))})")
            return cls(**values)
        except ConfigError as error:
            raise ConfigError(f"data: {error}") from None

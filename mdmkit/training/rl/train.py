"""`train.py experiment=<task>_rl`: RL on an MDM run's machinery (data stream, checkpoints, resume, evaluation)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mdmkit.training.preflight import TrainingPlan
from mdmkit.training.rl.module import RLModule
from mdmkit.training.train import run_training


def run_rl_training(plan: TrainingPlan, output_dir: Path, on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train with RL from `init_from`'s weights, save `model.pt`, evaluate the test split with `sampler`."""
    return run_training(plan, output_dir, on_start, module_class=RLModule)

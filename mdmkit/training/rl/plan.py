"""An RL run's `rl` node, built and checked once before Lightning is imported (the plan puts it beside the MDM
run's parts in `RLParts`, mdmkit/training/preflight.py)."""

from __future__ import annotations

from typing import Any

from mdmkit.core.config import build, require
from mdmkit.io.naming import derive_family, row_label
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.run_config import DataConfig


def plan_rl(config: dict[str, Any], data: DataConfig) -> tuple[RLConfig, tuple[str, ...]]:
    """An RL run's settings and what its banner says of them; every failure one line naming its key."""
    from mdmkit.evaluation.generation import check_trained_for

    settings = build(config["rl"], "rl")
    require(isinstance(settings, RLConfig), "rl: its _target_ must be mdmkit.training.rl.config.RLConfig")
    require(bool(settings.rewards), "rl.rewards is empty: name at least one reward (conf/reward/), e.g. "
            "+reward@rl.rewards.verified=verified")
    check_trained_for(str(config["objective"].get("_target_", "")), settings.sampler)
    rollout = {"kind": "train", "sampler": config["rl"]["sampler"]}
    rollout["family"] = derive_family(rollout)
    rewards = ", ".join(f"{name} x{reward.weight:g}" for name, reward in settings.rewards.items())
    note = (f"rl: {data.batch_size} prompts x {settings.group_size} rollouts per step by {row_label(rollout)}; "
            f"{settings.inner_updates} update(s) each; {type(settings.estimator).__name__}, "
            f"{type(settings.loss).__name__} (beta={settings.loss.beta:g}); rewards: {rewards}")
    return settings, (note,)

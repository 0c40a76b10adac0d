"""An RL run's plan: the MDM run's parts (task, network spec, optimizer, evaluation sampler) and its `rl` node,
built and checked once before Lightning is imported."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mdmkit.core.config import build, require
from mdmkit.io.naming import derive_family, row_label
from mdmkit.training.preflight import MDMParts, build_parts
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.run_config import DataConfig


@dataclass(frozen=True)
class RLParts(MDMParts):
    """An MDM run's parts and its RL settings (`rl`): the module validates with the MDM objective and the
    `val_sampler` as any MDM run, and trains with `rl`."""

    rl: RLConfig


def plan_rl(config: dict[str, Any], data: DataConfig) -> tuple[RLParts, tuple[str, ...]]:
    """The parts of an RL run and what its banner says of it; every failure one line naming its key."""
    from mdmkit.evaluation.generation import check_trained_for

    parts = build_parts(config, data)
    settings = build(config["rl"], "rl")
    require(isinstance(settings, RLConfig), "rl: its _target_ must be mdmkit.training.rl.config.RLConfig")
    require(bool(settings.rewards), "rl.rewards is empty: name at least one reward (conf/reward/), e.g. "
            "+reward@rl.rewards.verified=verified")
    check_trained_for(str(config["objective"].get("_target_", "")), settings.sampler)
    fields = {field.name: getattr(parts, field.name) for field in dataclasses.fields(MDMParts)}
    rollout = {"kind": "train", "sampler": config["rl"]["sampler"]}
    rollout["family"] = derive_family(rollout)
    rewards = ", ".join(f"{name} x{reward.weight:g}" for name, reward in settings.rewards.items())
    note = (f"rl: {data.batch_size} prompts x {settings.group_size} rollouts per step by {row_label(rollout)}; "
            f"{settings.inner_updates} update(s) each; {type(settings.estimator).__name__}, "
            f"{type(settings.loss).__name__} (beta={settings.loss.beta:g}); rewards: {rewards}")
    return RLParts(**fields, rl=settings), (note,)

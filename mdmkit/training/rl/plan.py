"""An RL run's `rl` node, built and checked once before Lightning is imported: beside an MDM run's parts
(`RLParts`, mdmkit/training/preflight.py), or beside a fine-tuning run's (`TextRLParts`: a pretrained diffusion LLM,
its LoRA settings and its text task, `sft` as experiment=llada_sft configures them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdmkit.core.config import build, require
from mdmkit.io.naming import derive_family, row_label
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.run_config import DataConfig, RunConfig
from mdmkit.training.sft.config import SFTParts


@dataclass(frozen=True)
class TextRLParts(SFTParts):
    """A fine-tuning run's parts (model, LoRA, text task, optimizer; saved and evaluated as one) and the RL
    settings (`rl`)."""

    rl: RLConfig


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


def plan_text_rl(config: dict[str, Any], run: RunConfig, data: DataConfig,
                 preset: str | None = None) -> tuple[TextRLParts, tuple[str, ...]]:
    """An RL run on a pretrained diffusion LLM: the fine-tuning run's checks (model, LoRA, task, evaluation after
    training) and the RL settings'; its prompts are the task's training documents."""
    from mdmkit.training.sft.preflight import plan_sft

    sft = plan_sft(config, run, data, preset)
    task = sft.parts.task
    require(task is not None, "an RL run on a diffusion LLM takes its prompts from a text task: task=gsm8k (or "
            "humaneval / mbpp, whose programs the sandbox runs)")
    settings, notes = plan_rl(config, data)
    prompts = f"prompts: {task.name}'s training split" if task is not None else ""
    return TextRLParts(**vars(sft.parts), rl=settings), (prompts, *notes, *sft.notes[1:])

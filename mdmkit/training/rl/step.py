"""One RL step without Lightning: collect (rollouts, rewards, advantages, the old and reference likelihoods) and
the loss of one inner update on what was collected. The Lightning module and the tests drive these."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.models.denoiser import Denoiser
from mdmkit.objectives.rl import group_advantages
from mdmkit.objectives.rl.likelihood import Network
from mdmkit.tasks.base import PuzzleTask
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.rewards import RewardResult, Task, score_rollouts
from mdmkit.training.rl.rollout import Rollouts, evaluating, roll_out, with_attention


@dataclass
class Experience:
    """What the inner updates of one step train on. `old[i]` / `ref[i]`: the rolling-out policy's and the
    reference's estimates under inner update i's mask (None: one inner update or a loss without a ratio, or no
    reference)."""

    rollouts: Rollouts
    rewards: RewardResult
    advantages: torch.Tensor
    mask_seeds: list[int]
    old: list[torch.Tensor] | None
    ref: list[torch.Tensor] | None

    def metrics(self) -> dict[str, float]:
        """What the step logs of its rollouts: reward (total and each part), NFE per rollout, unfinished share."""
        rollouts = self.rollouts
        found = {"reward": self.rewards.total.mean().item(), "nfe": rollouts.nfe.float().mean().item(),
                 "unfinished": 1.0 - rollouts.finished.float().mean().item(),
                 "reward_std": self.rewards.total.view(-1, rollouts.group_size).std(1).mean().item()}
        found.update({f"reward/{name}": part.mean().item() for name, part in self.rewards.parts.items()})
        return found

    def state(self) -> dict[str, Any]:
        """Plain data (tensors on the CPU, lists, numbers, strings) that a checkpoint keeps and loads back with
        `weights_only`: what a run resumed between two inner updates needs to go on as the uninterrupted one."""
        rollouts = self.rollouts
        return {"rollouts": {name: _to_cpu(getattr(rollouts, name)) for name in _ROLLOUT_FIELDS},
                "rewards": {"total": self.rewards.total.cpu(), "failed": list(self.rewards.failed),
                            "parts": {name: part.cpu() for name, part in self.rewards.parts.items()}},
                "advantages": self.advantages.cpu(), "mask_seeds": list(self.mask_seeds),
                "old": _to_cpu(self.old), "ref": _to_cpu(self.ref)}

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> Experience:
        """The experience `state` kept, its tensors on `device`."""
        rollouts = Rollouts(**{name: _to(value, device) for name, value in state["rollouts"].items()})
        rewards = state["rewards"]
        return cls(rollouts, RewardResult(rewards["total"].to(device), _to(rewards["parts"], device),
                                          list(rewards["failed"])),
                   state["advantages"].to(device), list(state["mask_seeds"]), _to(state["old"], device),
                   _to(state["ref"], device))


_ROLLOUT_FIELDS = ("tokens", "target", "answer_mask", "nfe", "mask_id", "group_size", "texts", "docs", "attention")


def _to(value: Any, device: torch.device | str) -> Any:
    """`value` with every tensor in it (through lists, tuples and dicts) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return [_to(item, device) for item in value]
    if isinstance(value, dict):
        return {key: _to(item, device) for key, item in value.items()}
    return value


def _to_cpu(value: Any) -> Any:
    return _to(value, "cpu")


@torch.no_grad()
def collect(network: Denoiser, reference: Network | None, settings: RLConfig, task: PuzzleTask,
            tokens: torch.Tensor, answer_mask: torch.Tensor, seed: int, failures: Counter[str] | None = None
            ) -> Experience:
    """Roll out `settings.group_size` completions of each prompt of `tokens` / `answer_mask` [P, L] (draws from
    `seed`), then `prepare` them."""
    rollouts = roll_out(network, settings.sampler, task, tokens, answer_mask, settings.group_size,
                        seeded_generator(stream_seed(seed, 0), tokens.device))
    return prepare(network, reference, settings, task, rollouts, seed, failures)


@torch.no_grad()
def prepare(network: Network, reference: Network | None, settings: RLConfig, task: Task, rollouts: Rollouts,
            seed: int, failures: Counter[str] | None = None) -> Experience:
    """Score `rollouts`, and estimate the old and reference likelihoods under each inner update's mask (mask
    seeds from `seed`)."""
    device = rollouts.tokens.device
    rewards = score_rollouts(settings.rewards, rollouts, task, failures)
    advantages = group_advantages(rewards.total, settings.group_size, settings.scale_advantages)
    seeds = [stream_seed(seed, 1 + i) for i in range(settings.inner_updates)]

    def estimates(scorer: Network) -> list[torch.Tensor]:
        with evaluating(scorer):  # the old and reference policies without dropout's noise
            return [settings.estimator(with_attention(scorer, rollouts.attention), rollouts.tokens,
                                       rollouts.completion, rollouts.mask_id, seeded_generator(s, device), advantages)
                    for s in seeds]

    old = estimates(network) if settings.inner_updates > 1 and settings.loss.uses_old_policy else None
    ref = estimates(reference) if reference is not None and settings.keeps_reference else None
    return Experience(rollouts, rewards, advantages, seeds, old, ref)


def inner_loss(network: Network, settings: RLConfig, experience: Experience, inner: int,
               mask_id: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of inner update `inner` (0-based) on `experience`, with that update's mask."""
    rollouts = experience.rollouts
    device = rollouts.tokens.device
    scorer = with_attention(network, rollouts.attention)
    logp = settings.estimator(scorer, rollouts.tokens, rollouts.completion, mask_id,
                              seeded_generator(experience.mask_seeds[inner], device), experience.advantages)
    old = experience.old[inner] if experience.old is not None else None
    ref = experience.ref[inner] if experience.ref is not None else None
    return settings.loss(logp, experience.advantages.to(logp.dtype), rollouts.completion, settings.group_size,
                         old, ref)

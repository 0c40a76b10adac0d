"""One RL step, measured in its three parts: the rollouts, the scoring of them (rewards, advantages, the old and the
reference policies' likelihood estimates) and the `mu` inner updates (estimate, loss, backward, clip, AdamW).

The step is the one `experiment=<task>_rl` takes (mdmkit/training/rl/step.py: `roll_out`, `prepare`, `inner_loss`),
timed between its parts with the device synchronised. Two kinds of case: the CPU Sudoku model
(checkpoints/sudoku_mdm.pt, its task and verifier, `experiment=sudoku_rl`'s settings) and a LLaDA-architecture
`DiffusionLM` with seeded random weights under LoRA (made on the device: `benchmarks.llm_path.random_llm`), rolling
out random prompts on a fixed schedule (`k` tokens per forward in blocks, d1's rollout shape), rewarded by a
stand-in that needs no task (`TokenParity`: random weights solve nothing, and only the time is measured).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.samplers import Sampler
from mdmkit.training.optim import OptimConfig
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.rewards import Reward
from mdmkit.training.rl.rollout import Rollouts, roll_out
from mdmkit.training.rl.step import inner_loss, prepare


@dataclass
class TokenParity(Reward):
    """1 where the sum of a rollout's completion tokens is even: a reward that varies between rollouts without a
    task to verify them (a random network's rollouts)."""

    def score(self, rollouts: Rollouts, task: Any) -> torch.Tensor:
        return ((rollouts.tokens * rollouts.completion).sum(1) % 2 == 0).float()


class RandomPrompts:
    """What `roll_out` asks of a task, for prompts of random tokens: the mask id, no stop condition."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def stop_condition(self) -> None:
        return None


@dataclass
class Case:
    """One measured setting: the network trained (and its reference: None without a KL term), the RL settings,
    the task (or `RandomPrompts`) and the prompts, P per step, `tokens` / `answer_mask` [N, L] cycled through."""

    name: str
    network: torch.nn.Module
    reference: Any
    settings: RLConfig
    task: Any
    tokens: torch.Tensor
    answer_mask: torch.Tensor
    prompts: int
    bf16: bool = False
    clip: float = 1.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rl_step(case: Case, optimizer: torch.optim.Optimizer, index: int, seed: int = 0) -> dict[str, float]:
    """Step `index` of `case`: its seconds in rollouts, scoring and updates, and the NFE per rollout."""
    device = case.tokens.device
    rows = torch.arange(index * case.prompts, (index + 1) * case.prompts) % len(case.tokens)
    step_seed = stream_seed(seed, index)
    settings = case.settings
    trained = [p for p in case.network.parameters() if p.requires_grad]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.bf16)
    synchronize(device)
    started = time.perf_counter()
    with autocast:
        rollouts = roll_out(case.network, settings.sampler, case.task, case.tokens[rows], case.answer_mask[rows],
                            settings.group_size, seeded_generator(stream_seed(step_seed, 0), device))
    synchronize(device)
    rolled = time.perf_counter()
    with autocast:
        experience = prepare(case.network, case.reference, settings, case.task, rollouts, step_seed)
    synchronize(device)
    scored = time.perf_counter()
    losses = []
    for inner in range(settings.inner_updates):
        with torch.enable_grad(), autocast:
            loss, _ = inner_loss(case.network, settings, experience, inner, rollouts.mask_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, case.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    synchronize(device)
    updated = time.perf_counter()
    return {"rollout_s": rolled - started, "scoring_s": scored - rolled, "update_s": updated - scored,
            "nfe": rollouts.nfe.float().mean().item(), "reward": experience.rewards.total.mean().item(),
            "loss": float(losses[-1])}


def measure(case: Case, steps: int, warmup: int, lr: float) -> dict[str, Any]:
    """`warmup` untimed steps then `steps` timed ones of `case`: the median of each part's seconds over the timed
    steps (each part on its own), their NFE per rollout and the per-step values."""
    optimizer = OptimConfig(lr=lr).adamw(case.network)
    for index in range(warmup):
        rl_step(case, optimizer, index)
    timed = [rl_step(case, optimizer, warmup + index) for index in range(steps)]
    median = {key: statistics.median(step[key] for step in timed) for key in ("rollout_s", "scoring_s", "update_s")}
    rollouts = case.prompts * case.settings.group_size
    return {**median, "step_s": sum(median.values()), "rollout_over_update": median["rollout_s"] / median["update_s"],
            "nfe": statistics.mean(step["nfe"] for step in timed), "rollouts": rollouts,
            "rollout_s_per_forward": median["rollout_s"] / max(1e-9, statistics.mean(s["nfe"] for s in timed)),
            "steps": timed}


def random_prompts(vocab_size: int, mask_id: int, count: int, prompt: int, answer: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` rows of `prompt` random tokens (never the mask) then `answer` positions to fill, and their mask."""
    tokens = torch.randint(0, vocab_size, (count, prompt + answer), generator=torch.Generator().manual_seed(0))
    tokens = torch.where(tokens == mask_id, 0, tokens)
    answer_mask = (torch.arange(prompt + answer) >= prompt).expand(count, -1).clone()
    return tokens.to(device), answer_mask.to(device)


def rl_settings(base: RLConfig, sampler: Sampler, group_size: int, inner_updates: int, beta: float,
                rewards: Sequence[tuple[str, Reward]] | None = None) -> RLConfig:
    """`base` with the case's sampler, group size, inner updates and KL weight (and rewards)."""
    from dataclasses import replace

    return replace(base, sampler=sampler, group_size=group_size, inner_updates=inner_updates,
                   loss=replace(base.loss, beta=beta),
                   rewards=dict(rewards) if rewards is not None else base.rewards)

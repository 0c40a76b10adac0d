"""Group-relative advantages: each rollout's reward against the other rollouts of its prompt (GRPO's baseline)."""

from __future__ import annotations

import torch

from mdmkit.core.config import require


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """`rewards` [P * G], the G rollouts of each prompt in consecutive rows: the reward minus its group's mean,
    divided by the group's standard deviation (+ `eps`) when `scale` (without it: Dr. GRPO's unscaled form). A
    group whose rollouts all score alike gets advantage 0: it carries no signal about which rollout is better."""
    require(group_size >= 2, f"group_size={group_size}: a group of one has no baseline (its advantage is always 0, "
            "so nothing would train); use 2 or more rollouts per prompt")
    require(rewards.ndim == 1 and rewards.numel() % group_size == 0,
            f"{tuple(rewards.shape)} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(1, keepdim=True)
    if scale:
        spread = grouped.std(1, keepdim=True)
        centred = torch.where(spread > 0, centred / (spread + eps), 0.0)
    return centred.flatten()

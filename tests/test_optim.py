"""The learning-rate schedule, against its formula: warm-up, cosine by steps, cosine by a time budget."""

from __future__ import annotations

import math

import pytest
import torch

from mdmkit.training.optim import OptimConfig, WarmupCosine

CONFIG = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)


def cosine(progress: float) -> float:
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize(("step", "time_spent", "expected"), [
    (0, 0.0, 0.1), (4, 0.9, 0.5),  # warm-up: linear, whatever the time
    (10, 0.0, 1.0), (60, 0.0, cosine(0.5)), (110, 0.0, 0.1), (500, 0.0, 0.1),  # cosine over steps 10..110
    (60, 0.25, cosine(0.5)), (60, 0.75, cosine(0.75)), (20, 1.0, 0.1),  # the further of steps and time
])
def test_lr_factor(step: int, time_spent: float, expected: float) -> None:
    assert CONFIG.lr_factor(step, total_steps=110, time_spent=time_spent) == pytest.approx(expected)


def test_the_scheduler_takes_the_time_spent_at_its_next_step() -> None:
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([weight], lr=1.0)
    schedule = WarmupCosine(optimizer, CONFIG, total_steps=110)
    for _ in range(20):
        optimizer.step()
        schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cosine(0.1))  # step 20 of the steps' cosine
    schedule.time_spent = 0.5
    optimizer.step()
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cosine(0.5))
    assert schedule.state_dict()["time_spent"] == 0.5  # kept in a checkpoint like the step count

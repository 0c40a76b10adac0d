"""The toy result: on a tiny random MDM, reward 1 when position 0 holds a chosen token; GRPO with rollouts from a
sampler (and wd1, and the coupled and ELBO estimators) raise that token's probability past 0.9 within 100 steps.
Seeded, so every run takes the same steps. Without a KL term: the reference here is the random start, which a KL
term holds the policy near by design (the last test)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from fakes import random_transformer

from mdmkit.objectives.rl import (
    CoupledEstimator,
    GRPOLoss,
    MonteCarloELBO,
    OneStepEstimator,
    SandwichEstimator,
    SPGLoss,
    WD1Loss,
)
from mdmkit.samplers import ThresholdSampler, TopKSampler
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.rewards import Reward, Task
from mdmkit.training.rl.rollout import Rollouts
from mdmkit.training.rl.step import collect, inner_loss

MASK, CHOSEN, LENGTH = 4, 2, 4


class ToyTask:
    """What a rollout needs of a task: its mask id and no stop condition."""

    mask_id = MASK

    def stop_condition(self) -> None:
        return None


@dataclass
class ChosenAtZero(Reward):
    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        return (rollouts.tokens[:, 0] == CHOSEN).float()


def probability_at_zero(network: torch.nn.Module) -> float:
    prompt = torch.tensor([[MASK, MASK, MASK, 0]])
    with torch.no_grad():
        return network(prompt)[0, 0].softmax(-1)[CHOSEN].item()


def train(settings: RLConfig, steps: int = 100, lr: float = 0.03) -> list[float]:
    network = random_transformer(MASK + 1, LENGTH, seed=0, n_layers=1, d_model=16)
    reference = random_transformer(MASK + 1, LENGTH, seed=0, n_layers=1, d_model=16).requires_grad_(False)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
    tokens = torch.tensor([[1, 1, 1, 0]]).repeat(4, 1)
    answer = torch.tensor([[True, True, True, False]]).repeat(4, 1)
    history = [probability_at_zero(network)]
    for step in range(steps):
        experience = collect(network, reference, settings, ToyTask(), tokens, answer, seed=step)  # type: ignore[arg-type]
        for inner in range(settings.inner_updates):
            loss, _ = inner_loss(network, settings, experience, inner, MASK)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        history.append(probability_at_zero(network))
    return history


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("estimator", "loss", "inner"), [
    (OneStepEstimator(), GRPOLoss(beta=0.0), 1),
    (OneStepEstimator(), GRPOLoss(beta=0.0), 2),
    (CoupledEstimator(), GRPOLoss(beta=0.0), 1),
    (MonteCarloELBO(), GRPOLoss(beta=0.0), 1),
    (OneStepEstimator(), WD1Loss(), 1),
    (SandwichEstimator(), SPGLoss(), 1),
], ids=["d1", "d1_two_inner_updates", "coupled", "elbo", "wd1", "spg"])
def test_the_rewarded_token_passes_probability_0_9_within_100_steps(estimator: object, loss: object,
                                                                     inner: int) -> None:
    torch.manual_seed(0)
    settings = RLConfig(group_size=8, inner_updates=inner, sampler=TopKSampler(temperature=1.0),
                        estimator=estimator, loss=loss, rewards={"chosen": ChosenAtZero()})  # type: ignore[arg-type]
    history = train(settings)
    assert history[0] < 0.5
    assert max(history) > 0.9, f"reached {max(history):.3f}"


def test_any_sampler_rolls_out_and_its_nfe_is_recorded() -> None:
    network = random_transformer(MASK + 1, LENGTH, seed=0, n_layers=1, d_model=16)
    tokens = torch.tensor([[1, 1, 1, 0]]).repeat(2, 1)
    answer = torch.tensor([[True, True, True, False]]).repeat(2, 1)
    for sampler, most in ((TopKSampler(temperature=1.0), 3), (ThresholdSampler(tau=1e-6, temperature=1.0), 1)):
        settings = RLConfig(group_size=4, sampler=sampler, rewards={"chosen": ChosenAtZero()})
        experience = collect(network, None, settings, ToyTask(), tokens, answer, seed=0)  # type: ignore[arg-type]
        assert experience.rollouts.nfe.tolist() == [most] * 8
        assert experience.rollouts.finished.all()


@pytest.mark.usefixtures("one_thread")
def test_a_kl_term_holds_the_policy_nearer_its_reference() -> None:
    def final(beta: float) -> float:
        torch.manual_seed(0)
        settings = RLConfig(group_size=8, sampler=TopKSampler(temperature=1.0), loss=GRPOLoss(beta=beta),
                            rewards={"chosen": ChosenAtZero()})
        return train(settings, steps=40)[-1]

    assert final(0.5) < final(0.0)

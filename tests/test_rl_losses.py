"""The policy losses and advantages on exact small cases: a 2-token vocabulary whose policy is one logit vector
theta per position (p = softmax(theta)), rollouts few enough to write every term of the loss and its gradient
out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mdmkit.core.errors import ConfigError
from mdmkit.objectives.rl import GRPOLoss, SPGLoss, WD1Loss, group_advantages


def _policy(theta: torch.Tensor, rollouts: torch.Tensor) -> torch.Tensor:
    """log p(rollouts[b, k]) under p = softmax(theta[k]) [B, L]: a network that ignores its input."""
    return theta.log_softmax(-1).expand(len(rollouts), -1, -1).gather(-1, rollouts[..., None]).squeeze(-1)


def test_advantages_are_rewards_against_their_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # two prompts, two rollouts each
    got = group_advantages(rewards, 2, eps=0.0)
    assert torch.allclose(got, torch.tensor([math.sqrt(0.5), -math.sqrt(0.5), 0.0, 0.0]))  # (1-.5)/std(1,0)=.707
    assert torch.allclose(group_advantages(rewards, 2, scale=False), torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_a_group_of_one_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="group_size=1: a group of one has no baseline"):
        group_advantages(torch.ones(4), 1)


def test_grpo_with_one_inner_update_is_the_policy_gradient() -> None:
    """Ratio 1, loss 0 at the rollouts' own policy; the gradient is -(1/N) sum_k A_b grad log p(o_bk)."""
    theta = torch.zeros(1, 2, requires_grad=True)
    rollouts = torch.tensor([[0], [1]])
    advantages = group_advantages(torch.tensor([1.0, 0.0]), 2)
    loss, metrics = GRPOLoss(beta=0.0)(_policy(theta, rollouts), advantages, torch.ones(2, 1, dtype=torch.bool), 2)
    loss.backward()
    a = advantages[0].item()
    # d log p(0)/d theta = e0 - p = (.5, -.5); d log p(1)/d theta = (-.5, .5); mean over the 2 tokens
    expected = -(a * torch.tensor([0.5, -0.5]) + (-a) * torch.tensor([-0.5, 0.5])) / 2
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert torch.allclose(theta.grad[0], expected)
    assert metrics["clip_frac"].item() == 0.0


def test_grpo_clips_a_ratio_past_its_range_on_the_side_of_the_advantage() -> None:
    """rho = e^0.5 > 1.2: a positive advantage takes the clipped term (no gradient), a negative one the unclipped
    term, whose gradient is -A rho grad log p / N."""
    theta = torch.zeros(1, 2, requires_grad=True)
    rollouts = torch.tensor([[0], [1]])
    logp = _policy(theta, rollouts)
    old = logp.detach() - 0.5
    advantages = torch.tensor([1.0, -1.0])
    loss, metrics = GRPOLoss(beta=0.0, clip=0.2)(logp, advantages, torch.ones(2, 1, dtype=torch.bool), 2, old)
    loss.backward()
    rho = math.exp(0.5)
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + rho * -1.0) / 2, rel=1e-6)
    assert torch.allclose(theta.grad[0], -(-1.0 * rho * torch.tensor([-0.5, 0.5])) / 2)
    assert metrics["clip_frac"].item() == pytest.approx(0.5)


def test_grpo_kl_term_is_k3_and_its_gradient() -> None:
    """With A = 0 only beta * mean(exp(r - p) - (r - p) - 1) is left; d/dp = beta (1 - exp(r - p)) / N."""
    theta = torch.tensor([[0.4, -0.4]], requires_grad=True)
    rollouts = torch.tensor([[0], [1], [1]])
    logp = _policy(theta, rollouts)
    ref = torch.tensor([[-0.9], [-0.5], [-0.5]])
    loss, metrics = GRPOLoss(beta=0.1)(logp, torch.zeros(3), torch.ones(3, 1, dtype=torch.bool), 3, None, ref)
    p = logp.detach()[:, 0]
    k3 = torch.exp(ref[:, 0] - p) - (ref[:, 0] - p) - 1
    assert loss.item() == pytest.approx(0.1 * k3.mean().item(), rel=1e-6)
    assert metrics["kl"].item() == pytest.approx(k3.mean().item(), rel=1e-6)
    loss.backward()
    probs = theta.detach().softmax(-1)[0]
    grads = [torch.eye(2)[int(o)] - probs for o in rollouts[:, 0]]
    expected = sum(0.1 * (1 - math.exp(ref[i, 0].item() - p[i].item())) * grads[i] for i in range(3)) / 3
    assert torch.allclose(theta.grad[0], expected, atol=1e-6)


def test_grpo_averages_over_completion_tokens_only() -> None:
    theta = torch.zeros(3, 2, requires_grad=True)
    rollouts = torch.tensor([[0, 1, 1], [1, 1, 0]])
    completion = torch.tensor([[True, True, False], [False, True, True]])
    loss, _ = GRPOLoss(beta=0.0)(_policy(theta, rollouts), torch.tensor([2.0, -2.0]), completion, 2)
    loss.backward()
    assert torch.equal(theta.grad[2].abs() > 0, torch.tensor([True, True]))  # row 1's token 2 counts
    # token 2 of row 0 is outside the completion: only row 1's (A=-2, o=0) reaches theta[2]
    assert torch.allclose(theta.grad[2], -(-2.0 * torch.tensor([0.5, -0.5])) / 4)


def test_wd1_weights_each_group_by_softmaxes_of_its_advantages() -> None:
    """Loss = sum_i (softmax(-A)_i - softmax(A)_i) log pi(o_i), per group, mean over groups; no ratio."""
    theta = torch.zeros(2, 2, requires_grad=True)
    rollouts = torch.tensor([[0, 0], [1, 0], [1, 1], [0, 1]])
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    logp = _policy(theta, rollouts)
    loss, _ = WD1Loss()(logp, advantages, torch.ones(4, 2, dtype=torch.bool), 2)
    sequences = logp.detach().sum(1).view(2, 2)
    grouped = advantages.view(2, 2)
    weights = (-grouped).softmax(1) - grouped.softmax(1)
    assert loss.item() == pytest.approx((weights * sequences).sum(1).mean().item(), rel=1e-6)
    loss.backward()
    probs = torch.full((2,), 0.5)
    expected = torch.zeros(2, 2)
    for i, weight in enumerate(weights.flatten()):
        for k in range(2):
            expected[k] += weight * (torch.eye(2)[int(rollouts[i, k])] - probs) / 2
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_wd1_without_the_negative_term_and_on_a_group_scoring_alike() -> None:
    theta = torch.zeros(1, 2, requires_grad=True)
    rollouts = torch.tensor([[0], [1]])
    loss, _ = WD1Loss(negative=True)(_policy(theta, rollouts), torch.zeros(2), torch.ones(2, 1, dtype=torch.bool), 2)
    loss.backward()
    assert torch.allclose(theta.grad, torch.zeros(1, 2))  # equal weights cancel
    theta.grad = None
    loss, _ = WD1Loss(negative=False, temperature=2.0)(_policy(theta, rollouts), torch.tensor([1.0, -1.0]),
                                                        torch.ones(2, 1, dtype=torch.bool), 2)
    w = torch.tensor([2.0, -2.0]).softmax(0)
    assert loss.item() == pytest.approx(-(w * math.log(0.5)).sum().item(), rel=1e-6)


def test_spg_weighs_each_rollouts_bound_by_its_advantage_over_the_completion_tokens() -> None:
    """Loss = -sum_i A_i sum_k est_ik / sum_i |o_i|: no ratio, no group softmax; a position outside the completion
    neither counts nor gets a gradient."""
    theta = torch.zeros(2, 2, requires_grad=True)
    rollouts = torch.tensor([[0, 0], [1, 0], [1, 1], [0, 1]])
    completion = torch.tensor([[True, True], [True, False], [True, True], [False, True]])
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    logp = _policy(theta, rollouts)
    loss, _ = SPGLoss()(logp, advantages, completion, 2)
    log_half = math.log(0.5)
    assert loss.item() == pytest.approx(-(1.0 * 2 - 1.0 * 1 + 0.5 * 2 - 0.5 * 1) * log_half / 6, rel=1e-6)
    loss.backward()
    expected = torch.zeros(2, 2)
    for i, advantage in enumerate(advantages):
        for k in range(2):
            if completion[i, k]:
                expected[k] -= advantage * (torch.eye(2)[int(rollouts[i, k])] - 0.5) / 6
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_bad_loss_settings_are_one_line() -> None:
    with pytest.raises(ConfigError, match="clip=1.5"):
        GRPOLoss(clip=1.5)
    with pytest.raises(ConfigError, match="beta=-1"):
        WD1Loss(beta=-1.0)
    with pytest.raises(ConfigError, match="SPG has no KL term"):
        SPGLoss(beta=0.04)

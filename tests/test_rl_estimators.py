"""The likelihood estimators of RL, each against its formula written out by hand, row by row, on a tiny network:
the masks drawn from the generator in the order each estimator's docstring states, one forward per mask."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import random_transformer

from mdmkit.core.errors import ConfigError
from mdmkit.objectives.rl import (
    CoupledEstimator,
    LikelihoodEstimator,
    MonteCarloELBO,
    OneStepEstimator,
    SandwichEstimator,
)

MASK, LENGTH = 3, 5


def _case() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    network = random_transformer(MASK + 1, LENGTH, n_layers=1, d_model=16)
    tokens = torch.tensor([[0, 1, 2, 1, 0], [2, 2, 0, 1, 1], [1, 0, 0, 2, 2]])
    completion = torch.tensor([[False, True, True, True, False], [False, False, True, True, True],
                               [True, True, True, True, True]])
    return network, tokens, completion


def _log_probs(network: torch.nn.Module, noisy: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[k] | noisy) at each position k, one sequence."""
    logits = network(torch.tensor([noisy]))[0].float()
    return torch.stack([logits[k].log_softmax(-1)[tokens[k]] for k in range(LENGTH)])


def test_one_step_masks_the_completion_whole_and_the_prompt_at_p() -> None:
    network, tokens, completion = _case()
    estimator = OneStepEstimator(p_mask=0.4)
    got = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(7))
    draws = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(7))
    for b in range(len(tokens)):
        noisy = [MASK if completion[b, k] or draws[b, k] < 0.4 else int(tokens[b, k]) for k in range(LENGTH)]
        scores = _log_probs(network, noisy, tokens[b])
        for k in range(LENGTH):
            assert got[b, k].item() == pytest.approx(scores[k].item() if completion[b, k] else 0.0, abs=1e-5)
    assert draws.lt(0.4).logical_and(~completion).any()  # some prompt position was masked in this case


def test_coupled_masks_score_every_completion_token_once_weighted_by_its_mask_rate() -> None:
    network, tokens, completion = _case()
    estimator = CoupledEstimator(t_min=0.2, t_max=0.8)
    got = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(3)
    t = 0.2 + 0.6 * torch.rand(3, generator=generator)
    draws = torch.rand(tokens.shape, generator=generator)
    for b in range(len(tokens)):
        first = [bool(completion[b, k]) and draws[b, k].item() < t[b].item() for k in range(LENGTH)]
        second = [bool(completion[b, k]) and not first[k] for k in range(LENGTH)]
        under_first = _log_probs(network, [MASK if m else int(x) for m, x in zip(first, tokens[b])], tokens[b])
        under_second = _log_probs(network, [MASK if m else int(x) for m, x in zip(second, tokens[b])], tokens[b])
        for k in range(LENGTH):
            want = (0.5 * under_first[k] / t[b] if first[k] else 0.5 * under_second[k] / (1 - t[b]) if second[k]
                    else torch.tensor(0.0))
            assert got[b, k].item() == pytest.approx(want.item(), abs=1e-5)
    assert estimator.forwards == 2


def test_monte_carlo_elbo_with_antithetic_times() -> None:
    network, tokens, completion = _case()
    estimator = MonteCarloELBO(samples=4, antithetic=True, t_min=0.01)
    got = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(11))
    generator = torch.Generator().manual_seed(11)
    u = torch.rand(3, 2, generator=generator)
    draws = torch.rand(4, 3, LENGTH, generator=generator)
    for b in range(len(tokens)):
        times = [0.01 + 0.99 * u[b, 0], 0.01 + 0.99 * u[b, 1], 0.01 + 0.99 * (1 - u[b, 0]), 0.01 + 0.99 * (1 - u[b, 1])]
        total = torch.zeros(LENGTH)
        for j, t in enumerate(times):
            masked = [bool(completion[b, k]) and draws[j, b, k].item() < t.item() for k in range(LENGTH)]
            scores = _log_probs(network, [MASK if m else int(x) for m, x in zip(masked, tokens[b])], tokens[b])
            total += torch.tensor([scores[k].item() / t.item() if masked[k] else 0.0 for k in range(LENGTH)])
        assert torch.allclose(got[b], total / 4, atol=1e-4)


def test_the_elbo_without_antithetic_draws_each_time_on_its_own() -> None:
    network, tokens, completion = _case()
    got = MonteCarloELBO(samples=1, antithetic=False, t_min=0.5)(network, tokens, completion, MASK,
                                                                  torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(2)
    t = 0.5 + 0.5 * torch.rand(3, 1, generator=generator)[:, 0]
    draws = torch.rand(1, 3, LENGTH, generator=generator)[0]
    for b in range(3):
        masked = completion[b] & (draws[b] < t[b])
        scores = _log_probs(network, torch.where(masked, MASK, tokens[b]).tolist(), tokens[b])
        assert torch.allclose(got[b], torch.where(masked, scores / t[b], 0.0), atol=1e-5)


def test_spg_bounds_under_block_wise_masks() -> None:
    """Blocks of 2 over each row's completion positions (in order); per sample a block picked, part of it masked
    (the `count` smallest draws), the later blocks whole, other positions at p_mask. The row with a positive
    advantage gets the lower bound, the others half the upper (Renyi, beta = 1.5) and half the lower."""
    network, tokens, completion = _case()
    estimator = SandwichEstimator(samples=3, block_length=2, t_min=0.2, t_max=1.0, p_mask=0.3, beta=1.5, mix=0.5)
    advantages = torch.tensor([1.0, -1.0, 0.0])
    got = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(4), advantages)
    generator = torch.Generator().manual_seed(4)
    pick, size = torch.rand(3, 3, generator=generator), torch.rand(3, 3, generator=generator)
    order, prompt = torch.rand(3, 3, LENGTH, generator=generator), torch.rand(3, 3, LENGTH, generator=generator)
    picked, hidden_prompt = set(), 0
    for b in range(len(tokens)):
        positions = [k for k in range(LENGTH) if completion[b, k]]
        blocks = [positions[i:i + 2] for i in range(0, len(positions), 2)]
        lower, powered = [0.0] * LENGTH, [0.0] * LENGTH
        for j in range(3):
            chosen = int(pick[j, b] * len(blocks))
            block, later = blocks[chosen], [k for rest in blocks[chosen + 1:] for k in rest]
            low = max(1, math.floor(len(block) * 0.2))
            count = low + int(size[j, b] * (max(low, len(block)) - low + 1))
            hidden = sorted(block, key=lambda k: order[j, b, k].item())[:count] + later
            others = [k for k in range(LENGTH) if k not in positions and prompt[j, b, k] < 0.3]
            scores = _log_probs(network, [MASK if k in hidden or k in others else int(tokens[b, k])
                                          for k in range(LENGTH)], tokens[b])
            for k in hidden:
                lower[k] += scores[k].item() * len(positions) / len(hidden) / 3
                powered[k] += math.exp(1.5 * scores[k].item()) * len(positions) / len(hidden) / 3
            picked.add((len(blocks), chosen))
            hidden_prompt += len(others)
        seen = [k for k in range(LENGTH) if powered[k] > 0]
        upper = [math.log(powered[k]) / 1.5 * len(positions) / len(seen) if k in seen else 0.0 for k in range(LENGTH)]
        want = lower if advantages[b] > 0 else [0.5 * u + 0.5 * v for u, v in zip(upper, lower)]
        assert got[b].tolist() == pytest.approx(want, abs=1e-4)
    assert {chosen for _, chosen in picked} == {0, 1} and hidden_prompt > 0  # both blocks and the prompt exercised
    assert estimator.forwards == 3
    with pytest.raises(ConfigError, match="pass advantages"):
        estimator(network, tokens, completion, MASK, None)


@pytest.mark.parametrize("estimator", [OneStepEstimator(), CoupledEstimator(), MonteCarloELBO()],
                         ids=["one_step", "coupled", "elbo"])
def test_one_generator_state_gives_one_estimate_and_its_gradient_reaches_the_network(
        estimator: LikelihoodEstimator) -> None:
    network, tokens, completion = _case()
    first = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(5))
    again = estimator(network, tokens, completion, MASK, torch.Generator().manual_seed(5))
    assert torch.equal(first, again) and torch.equal(first[~completion], torch.zeros(int((~completion).sum())))
    first.sum().backward()
    assert network.head.weight.grad is not None and network.head.weight.grad.abs().sum() > 0


def test_on_a_network_that_ignores_its_input_the_coupled_pair_averages_to_the_log_probability() -> None:
    """In expectation over t and the mask, each token's coupled estimate is its log-probability."""
    table = torch.tensor([[0.3, -0.2, 1.0, 0.0]]).expand(LENGTH, -1)
    network = lambda noisy: table.expand(noisy.shape[0], -1, -1)
    tokens = torch.tensor([[0, 1, 2, 1, 0]]).repeat(4000, 1)
    completion = torch.ones_like(tokens, dtype=torch.bool)
    got = CoupledEstimator()(network, tokens, completion, MASK, torch.Generator().manual_seed(0)).mean(0)
    exact = table.log_softmax(-1).gather(-1, tokens[0][:, None]).squeeze(-1)
    assert torch.allclose(got, exact, rtol=0.05)


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(ConfigError, match="antithetic draws come in pairs"):
        MonteCarloELBO(samples=3)
    with pytest.raises(ConfigError, match="p_mask=1.0"):
        OneStepEstimator(p_mask=1.0)
    with pytest.raises(ConfigError, match="t_min=0.9, t_max=0.1"):
        CoupledEstimator(t_min=0.9, t_max=0.1)
    with pytest.raises(ConfigError, match="mix=2"):
        SandwichEstimator(mix=2.0)

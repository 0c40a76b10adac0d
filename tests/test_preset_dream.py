"""The `dream_*` presets' two rules beyond the schedule, against Dream's `diffusion_generate` (generation_utils.py
of the hub model Dream-org/Dream-v0-Instruct-7B): the entropy order's epsilon and alg='origin's random count."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from fakes import FixedLogits

from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import DreamStepsSampler, ForwardCounter
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.ordering import entropy, entropy_with_eps
from mdmkit.samplers.rules.steps import DreamSchedule

pytestmark = pytest.mark.usefixtures("one_thread")


def dream_neg_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Dream's entropy score (higher is revealed first): sum p log(p + 1e-10)."""
    return (probs * torch.log(probs + 1e-10)).sum(-1)


def test_the_entropy_proxy_is_dreams_score_negated() -> None:
    probs = (torch.randn(4, 16, 300, generator=torch.Generator().manual_seed(0)) * 6).softmax(-1)
    assert torch.equal(entropy_with_eps(1e-10)(probs, None, None), -dream_neg_entropy(probs))


def two_tails(tail: int = 1_000_000) -> torch.Tensor:
    """Logits [3, V] of three positions: A, sure with one rival token (entropy 2.362e-3); B, as sure but with its
    doubt spread over `tail` tokens of 1e-10 each (2.403e-3, but a lower Dream score, 2.333e-3, since 1e-10 doubles
    each tail token's log); C, uniform. The mask token (the last) is ruled out. A sits mid-way between B's two
    scores: float32 sums of a million tail terms differ by CPU (AVX2 against AVX-512) by about 0.5%, and a
    narrower window (0.2%, with 1e-9 tokens) flipped the exact order on one CPU."""
    vocab = tail + 2
    rival, spread = 2.547e-4, 1e-4
    a = torch.full((vocab,), -1e4, dtype=torch.float64)
    a[0], a[1] = math.log(1 - rival), math.log(rival)
    b = torch.full((vocab,), -1e4, dtype=torch.float64)
    b[0], b[1 : tail + 1] = math.log(1 - spread), math.log(spread / tail)
    c = torch.zeros(vocab, dtype=torch.float64)
    c[-1] = -1e4
    return torch.stack([a, b, c]).float()


def test_dreams_epsilon_can_change_the_entropy_order() -> None:
    logits = two_tails()
    probs = logits.softmax(-1)
    exact, dream = entropy(probs), -dream_neg_entropy(probs)
    assert exact[0] < exact[1] and dream[1] < dream[0]  # the case is one where the two orders part
    mask = logits.shape[1] - 1
    for eps, first in ((1e-10, 1), (0.0, 0)):
        # 3 masks, 2 steps: the first step reveals int(3 * (1 - t1/t0)) = 1, the best by the entropy order
        sampler = DreamStepsSampler(steps=2, ordering="entropy", entropy_eps=eps, empty_steps=True)
        out = sampler.sample(ForwardCounter(FixedLogits(logits), 1), torch.full((1, 3), mask), mask)
        assert torch.nonzero(out.reveal_step[0] == 0).flatten().tolist() == [first]


# -- alg='origin': each masked position revealed on its own with probability 1 - s/t ---------------------


def origin_ranked(draws: torch.Tensor, n_eligible: torch.Tensor, step: int) -> Ranked:
    """The loop's view under the random order: the draws ascending, padding inf past each row's positions."""
    columns = torch.arange(draws.shape[1])
    error = draws.masked_fill(columns >= n_eligible[:, None], math.inf).sort(1).values
    zeros = torch.zeros_like(draws)
    return Ranked(entropy=zeros, confidence=zeros, n_eligible=n_eligible,
                  step_in_block=torch.full_like(n_eligible, step), block_size=n_eligible, error=error)


@pytest.mark.parametrize("step", [0, 2, 5])
def test_the_random_count_is_the_number_of_draws_below_one_minus_s_over_t(step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    draws = torch.rand(200, 12, generator=generator)
    n_eligible = torch.randint(1, 13, (200,), generator=generator)
    times = torch.linspace(1, 1e-3, 7)  # Dream: float32 timesteps, 6 steps
    rule = DreamSchedule(6, random_count=True)
    counts = rule(origin_ranked(draws, n_eligible, step))
    for row in range(200):
        n = int(n_eligible[row])
        expected = n if step == 5 else int((draws[row, :n] < 1 - times[step + 1] / times[step]).sum())
        assert counts[row].item() == expected
        alone = rule(origin_ranked(draws[row : row + 1], n_eligible[row : row + 1], step))
        assert alone.item() == counts[row].item()  # batched == one row at a time
    if step < 5:
        assert (counts == 0).any()  # with empty_steps, such a step spends its forward and reveals nothing


def test_origin_counts_follow_the_binomial() -> None:
    rows, length, mask = 4000, 12, 5
    logits = torch.randn(length, mask + 1, generator=torch.Generator().manual_seed(1))
    sampler = dataclasses.replace(build(option("sampler", "dream_origin"), "sampler"), steps=4)
    out = sampler.sample(ForwardCounter(FixedLogits(logits), rows), torch.full((rows, length), mask), mask,
                         torch.Generator().manual_seed(2))
    first = (out.reveal_step == 0).sum(1).float()
    times = torch.linspace(1, 1e-3, 5)
    p = float(1 - times[1] / times[0])
    # Binomial(12, p): mean 2.997, variance 2.248; the standard error of the mean is 0.024 at 4000 rows
    assert abs(first.mean().item() - length * p) < 0.1
    assert abs(first.var().item() - length * p * (1 - p)) < 0.3
    assert (out.tokens != mask).all()


def test_random_count_needs_the_random_order_and_entropy_eps_is_not_negative() -> None:
    assert build(option("sampler", "dream_origin"), "sampler").random_count
    with pytest.raises(ConfigError, match="random_count=true needs ordering=random"):
        DreamStepsSampler(random_count=True)
    with pytest.raises(ConfigError, match="entropy_eps=-1.0 must be >= 0"):
        DreamStepsSampler(entropy_eps=-1.0)

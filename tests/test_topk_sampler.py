"""Top-k confidence sampling against exact expectations on toy networks with known distributions."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import FixedConfidence as FixedDistribution
from fakes import random_transformer

from mdmkit.samplers import ForwardCounter, TopKSampler

V, MASK, L = 6, 5, 8


# FixedDistribution(conf): position i predicts token i % 5 with probability conf[i], independent of the input;
# records its inputs.
CONF = [0.5, 0.9, 0.3, 0.8, 0.95, 0.6, 0.7, 0.4]


def test_full_step_reveals_in_confidence_order_with_one_pass_per_token() -> None:
    net = FixedDistribution(CONF)
    prompt = torch.full((1, L), MASK)
    counter = ForwardCounter(net, 1)
    out = TopKSampler(k=1).sample(counter, prompt, MASK).tokens
    assert out.tolist() == [[i % 5 for i in range(L)]]  # argmax everywhere
    assert counter.nfe.tolist() == [L]
    revealed_order = [int((a != b).nonzero()[0, 1]) for a, b in zip(net.seen[1:], net.seen[:-1])]
    assert revealed_order == sorted(range(L), key=lambda i: -CONF[i])[: L - 1]


@pytest.mark.parametrize("k", [1, 2, 3, 8, 20])
def test_nfe_is_ceil_masked_over_k(k: int) -> None:
    net = FixedDistribution(CONF)
    prompt = torch.tensor([[MASK] * L, [0, MASK, 2, MASK, 4, MASK, 1, 2]])
    counter = ForwardCounter(net, 2)
    TopKSampler(k=k).sample(counter, prompt, MASK)
    assert counter.nfe.tolist() == [math.ceil(L / k), math.ceil(3 / k)]


def test_given_tokens_are_never_changed_and_finished_rows_stop_counting() -> None:
    net = FixedDistribution(CONF)
    prompt = torch.tensor([[MASK] * L, [0, 0, 0, 0, 0, 0, 0, MASK], [1] * L])
    counter = ForwardCounter(net, 3)
    out = TopKSampler(k=1).sample(counter, prompt, MASK).tokens
    assert torch.equal(out[1, :7], prompt[1, :7]) and torch.equal(out[2], prompt[2])
    assert counter.nfe.tolist() == [L, 1, 0]
    assert [t.shape[0] for t in net.seen] == [2] + [1] * (L - 1)  # the short row left after one pass


def test_temperature_sampling_matches_the_distribution() -> None:
    net = FixedDistribution(CONF)
    prompt = torch.full((4000, L), MASK)
    prompt[:, 1:] = 0  # only position 0 is masked: a single draw from its distribution
    sampler = TopKSampler(k=1, temperature=1.0)
    out = sampler.sample(ForwardCounter(net, 4000), prompt, MASK, torch.Generator().manual_seed(0)).tokens
    frequency = (out[:, 0] == 0).float().mean()
    assert abs(float(frequency) - CONF[0]) < 0.03
    assert (out[:, 0] != MASK).all()


def test_batched_equals_one_by_one_on_a_real_network() -> None:
    net = random_transformer(V, L)
    prompts = torch.randint(0, 5, (6, L))
    for row in range(6):
        prompts[row, torch.randperm(L)[: row + 2]] = MASK
    sampler = TopKSampler(k=2)
    batched_counter = ForwardCounter(net, 6)
    batched = sampler.sample(batched_counter, prompts, MASK).tokens
    for row in range(6):
        single_counter = ForwardCounter(net, 1)
        single = sampler.sample(single_counter, prompts[row : row + 1], MASK).tokens
        assert torch.equal(single[0], batched[row])
        assert single_counter.nfe.item() == batched_counter.nfe[row].item()


def test_counter_rejects_a_row_mismatch() -> None:
    counter = ForwardCounter(FixedDistribution(CONF), 2)
    with pytest.raises(ValueError, match="3 sequences passed for 2 rows"):
        counter(torch.zeros(3, L, dtype=torch.long), torch.tensor([0, 1]))

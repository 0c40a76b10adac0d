"""Dilated unmasking (DUS) against hand-worked schedules: the groups of a block, the reveal order per step and its
exact NFE (log2 of the block length per block), deferral, batching, stop conditions, caches and bad settings."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from fakes import FixedConfidence, LeftToRight, masked_rows, random_transformer

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build, option
from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.models.denoiser import KV_CACHE, require_capabilities
from mdmkit.samplers import DUSSampler, ForwardCounter
from mdmkit.samplers.rules.dus import dilated_groups

pytestmark = pytest.mark.usefixtures("one_thread")

V, MASK, L = 7, 6, 12
real_network = partial(random_transformer, V, L, head_scale=40.0)
prompts = partial(masked_rows, length=L, mask_id=MASK)


def sample(sampler: DUSSampler, network: torch.nn.Module, tokens: torch.Tensor, mask: int = MASK, **kwargs):
    counter = ForwardCounter(network, len(tokens))
    return sampler.sample(counter, tokens, mask, **kwargs), counter


# -- the schedule by hand ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "base", "skip", "groups"), [
    (8, 2, 1, [[0, 4], [2, 6], [1, 3, 5, 7]]),  # the paper's example (1-based there: {1,5}, {3,7}, {2,4,6,8})
    (16, 2, 1, [[0, 8], [4, 12], [2, 6, 10, 14], list(range(1, 16, 2))]),
    (10, 2, 1, [[0, 5], [2, 4, 6, 8], [1, 3, 7, 9]]),  # strides 5, 2, 1
    (9, 3, 1, [[0, 3, 6], [1, 2, 4, 5, 7, 8]]),  # strides 3, 1
    (8, 2, 2, [[0, 2, 4, 6], [1, 3, 5, 7]]),  # base_skip = 2: the first stride is 8 // 4
    (5, 2, 1, [[0, 2, 4, 1, 3]]),  # strides 2, 1: the last group (2) is smaller than the one before, so merged
    (3, 2, 1, [[0, 1, 2]]),  # stride 3 // 2 = 1 at once
    (8, 1, 1, [list(range(8))]),  # base 1: the whole block in one step
    (3, 4, 1, [[0, 1, 2]]),  # first stride 0: every offset is left over, in one group
    (1, 2, 1, [[0]]),
])
def test_groups_by_hand(size: int, base: int, skip: int, groups: list[list[int]]) -> None:
    assert dilated_groups(size, base, skip) == groups


@pytest.mark.parametrize(("base", "power"), [(2, 1), (2, 3), (2, 5), (2, 6), (3, 3), (4, 2)])
def test_a_block_of_base_to_the_k_takes_k_steps_and_each_group_spaces_its_positions(base: int, power: int) -> None:
    size = base**power
    groups = dilated_groups(size, base)
    assert len(groups) == power == math.ceil(math.log(size, base) - 1e-9)
    assert sorted(o for group in groups for o in group) == list(range(size))  # a partition of the block
    for number, group in enumerate(groups):  # group k: the new multiples of size // base**(k + 1)
        stride = size // base ** (number + 1)
        assert group == [o for o in range(0, size, stride) if all(o not in g for g in groups[:number])]


# -- the sampler on tables with known distributions ----------------------------------------------------------

CONF = [0.9, 0.6, 0.8, 0.7, 0.95, 0.5, 0.85, 0.75, 0.65, 0.55, 0.99, 0.45, 0.9, 0.8, 0.7, 0.6]


def test_two_blocks_of_eight_reveal_their_dilated_groups_in_six_forwards() -> None:
    net = FixedConfidence(CONF, vocab=6)  # position i predicts token i % 5 with probability CONF[i]
    out, counter = sample(DUSSampler(block_length=8), net, torch.full((1, 16), 5), mask=5)
    assert out.partition(0) == [[0, 4], [2, 6], [1, 3, 5, 7], [8, 12], [10, 14], [9, 11, 13, 15]]
    assert counter.nfe.tolist() == out.steps.tolist() == [6]  # 2 blocks x log2(8)
    assert out.tokens.tolist() == [[i % 5 for i in range(16)]]  # the argmax, whatever its confidence
    revealed = [sorted(torch.nonzero(seen[0] != 5).flatten().tolist()) for seen in net.seen]
    assert revealed == [[], [0, 4], [0, 2, 4, 6], list(range(8)), list(range(8)) + [8, 12],
                        list(range(8)) + [8, 10, 12, 14]]


def test_one_block_by_default_and_a_short_last_block() -> None:
    out, counter = sample(DUSSampler(), FixedConfidence(CONF[:10], vocab=6), torch.full((1, 10), 5), mask=5)
    assert out.partition(0) == [[0, 5], [2, 4, 6, 8], [1, 3, 7, 9]] and counter.nfe.item() == 3
    net = FixedConfidence(CONF[:11], vocab=6)
    out, counter = sample(DUSSampler(block_length=8), net, torch.full((1, 11), 5), mask=5)
    assert out.partition(0) == [[0, 4], [2, 6], [1, 3, 5, 7], [8, 9, 10]]  # the last block (3): one group
    assert counter.nfe.item() == 4


def test_offsets_count_the_blanks_so_givens_cost_no_step() -> None:
    net = FixedConfidence(CONF[:11], vocab=6)
    prompt = torch.tensor([[0, 5, 5, 1, 5, 5, 5, 2, 5, 5, 5]])  # blanks at 1 2 4 5 6 8 9 10: offsets 0..7
    out, counter = sample(DUSSampler(), net, prompt, mask=5)
    assert out.partition(0) == [[1, 6], [4, 9], [2, 5, 8, 10]] and counter.nfe.item() == 3
    assert out.tokens[0, [0, 3, 7]].tolist() == [0, 1, 2] and (out.reveal_step[0, [0, 3, 7]] == -1).all()


def test_defer_below_moves_a_doubtful_position_to_the_next_group_never_past_the_last() -> None:
    conf = [0.9, 0.9, 0.9, 0.9, 0.3, 0.9, 0.4, 0.9]  # 4 (group 1) and 6 (group 2) are doubtful
    net = FixedConfidence(conf, vocab=6)
    out, counter = sample(DUSSampler(defer_below=0.5), net, torch.full((1, 8), 5), mask=5)
    assert out.partition(0) == [[0], [2], [1, 3, 4, 5, 6, 7]]  # the last group reveals whatever is left
    assert counter.nfe.item() == 3  # NFE is the number of groups either way
    out, _ = sample(DUSSampler(defer_below=0.0), net, torch.full((1, 8), 5), mask=5)
    assert out.partition(0) == [[0, 4], [2, 6], [1, 3, 5, 7]]
    out, counter = sample(DUSSampler(defer_below=0.95), net, torch.full((1, 8), 5), mask=5)
    assert out.partition(0) == [[], [], list(range(8))] and counter.nfe.item() == 3  # steps may reveal nothing


def test_temperature_draws_follow_the_distribution_and_a_seed_fixes_them() -> None:
    x = torch.zeros(4000, 3, dtype=torch.long)
    x[:, 0] = 5  # one masked position: one step, one draw from its distribution (0.8 on token 0)
    net = FixedConfidence([0.8, 0.6, 0.55], vocab=6)
    out, _ = sample(DUSSampler(temperature=1.0), net, x, mask=5, generator=torch.Generator().manual_seed(0))
    assert abs(float((out.tokens[:, 0] == 0).float().mean()) - 0.8) < 0.03 and (out.tokens != 5).all()
    network, batch = real_network(), prompts()
    draw = lambda seed: sample(DUSSampler(temperature=1.0, block_length=4), network, batch,
                               generator=torch.Generator().manual_seed(seed))[0].tokens
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))


# -- batching, NFE, stop conditions, padding, caches ---------------------------------------------------------


def expected_nfe(prompt: torch.Tensor, sampler: DUSSampler) -> int:
    """Sum over the row's blocks of the number of dilated groups."""
    blanks = int((prompt == MASK).sum())
    width = blanks if sampler.block_length is None else sampler.block_length
    return sum(len(dilated_groups(min(width, blanks - start), sampler.base, sampler.base_skip))
               for start in range(0, blanks, max(width, 1)))


@pytest.mark.parametrize("sampler", [
    DUSSampler(), DUSSampler(block_length=4), DUSSampler(base=3, block_length=5), DUSSampler(base_skip=2),
    DUSSampler(defer_below=0.7, block_length=4), DUSSampler(top_p=0.5, block_length=3),
], ids=repr)
def test_batched_equals_one_row_at_a_time_and_nfe_is_the_number_of_groups(sampler: DUSSampler) -> None:
    network, batch = real_network(), prompts()
    batched, counter = sample(sampler, network, batch)
    assert (batched.tokens != MASK).all() and torch.equal(batched.tokens[batch != MASK], batch[batch != MASK])
    for row in range(len(batch)):
        single, single_counter = sample(sampler, network, batch[row : row + 1])
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert single_counter.nfe.item() == counter.nfe[row].item() == expected_nfe(batch[row], sampler)


def test_a_row_with_nothing_to_fill_is_never_forwarded() -> None:
    batch = prompts(2)
    batch[1] = 1
    _, counter = sample(DUSSampler(), real_network(), batch)
    assert counter.nfe.tolist() == [expected_nfe(batch[0], DUSSampler()), 0]


def test_generate_until_stops_a_row_once_its_stop_token_and_everything_before_are_revealed() -> None:
    stop_id, mask = 4, 5
    network = LeftToRight([1, 2, 3, stop_id, 0, 0, 0, 0], vocab=6)
    batch = torch.tensor([[1] + [mask] * 7, [mask] * 8])
    stop = StopCondition.of([stop_id])
    # blocks of two: one group, one step each
    out, counter = sample(DUSSampler(block_length=2), network, batch, mask=mask, stop=stop)
    assert out.tokens[0, :5].tolist() == [1, 2, 3, stop_id, 0] and (out.tokens[0, 5:] == mask).all()
    assert out.tokens[1, :4].tolist() == [1, 2, 3, stop_id] and (out.tokens[1, 4:] == mask).all()
    assert counter.nfe.tolist() == counter.nfe_at_stop.tolist() == [2, 2]
    full, counter = sample(DUSSampler(block_length=2, stop_early=False), network, batch, mask=mask, stop=stop)
    assert (full.tokens != mask).all()
    assert counter.nfe.tolist() == [4, 4] and counter.nfe_at_stop.tolist() == [2, 2]


def test_padding_is_invisible_to_the_network() -> None:
    network, prompt = real_network(), prompts(1)
    prompt[0, :3] = 0
    keep = torch.ones_like(prompt, dtype=torch.bool)
    keep[0, :3] = False
    other = prompt.clone()
    other[0, :3] = 4
    sampler = DUSSampler(block_length=3)
    a, _ = sample(sampler, network, prompt, attention_mask=keep)
    b, _ = sample(sampler, network, other, attention_mask=keep)
    assert torch.equal(a.tokens[0, 3:], b.tokens[0, 3:])
    both, _ = sample(sampler, network, torch.cat([prompt, prompts(2)[1:]]),
                     attention_mask=torch.cat([keep, torch.ones(1, L, dtype=torch.bool)]))
    assert torch.equal(both.tokens[0], a.tokens[0])


def test_a_cache_refreshed_every_step_is_the_plain_loop_and_a_dual_cache_keeps_the_nfe() -> None:
    network, batch = real_network(), prompts()
    plain, plain_counter = sample(DUSSampler(block_length=4), network, batch)
    cached, _ = sample(DUSSampler(block_length=4, cache="prefix", cache_refresh=1), network, batch)
    assert torch.equal(cached.tokens, plain.tokens) and torch.equal(cached.reveal_step, plain.reveal_step)
    dual, dual_counter = sample(DUSSampler(block_length=4, cache="dual"), network, batch)
    assert (dual.tokens != MASK).all() and torch.equal(dual_counter.nfe, plain_counter.nfe)
    assert (dual_counter.tokens < plain_counter.tokens).all()  # the block's later steps run only the block
    assert DUSSampler(block_length=4, cache="dual").requires == {KV_CACHE} and DUSSampler().requires == set()
    with pytest.raises(CapabilityError, match="kv_cache"):
        require_capabilities(DUSSampler(block_length=4, cache="dual"), FixedConfidence(CONF))


# -- configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"base": 0}, "base=0 must be >= 1"),
    ({"base_skip": 0}, "base_skip=0 must be >= 1"),
    ({"defer_below": 1.5}, r"defer_below=1.5 must lie in \[0, 1\]"),
    ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
    ({"top_p": 0.0}, r"top_p=0.0 must lie in \(0, 1\]"),
    ({"block_length": 0}, "block_length=0 must be >= 1 or null"),
    ({"cache": "dual"}, "cache=dual needs block_length"),
    ({"cache": "lazy", "block_length": 4}, "cache"),
    ({"cache_refresh": 2}, "cache_refresh=2 needs a cache"),
    ({"base": 2.5}, "base"),
])
def test_bad_settings_are_one_config_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        DUSSampler(**fields)
    assert "\n" not in str(error.value)


def test_the_option_builds_the_defaults_and_names_its_family() -> None:
    assert build(option("sampler", "dus"), "sampler") == DUSSampler()
    sampler = {"_target_": "mdmkit.samplers.DUSSampler", **option("sampler", "dus")}
    assert derive_family({"sampler": sampler}) == "dus"
    assert derive_family({"sampler": {**sampler, "cache": "dual"}}) == "dus+dual"

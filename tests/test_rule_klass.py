"""KLASS against hand-worked cases: a toy network whose distributions are scripted per step, so which positions are
stable (their KL to the previous step below the bound for history_length steps) and confident, what the fallback
reveals, and the NFE are known exactly; the strict bounds; history per block; batching; bad settings; the option."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial
from typing import Any

import pytest
import torch
from fakes import masked_rows, random_transformer

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import ForwardCounter, KlassSampler, TopKSampler
from mdmkit.samplers.rules.klass import kl_to_previous

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, M = 6, 5  # tokens 0..4, the mask is 5


def probs_row(token: int, p: float) -> torch.Tensor:
    """Log-probabilities: `token` at p, the other real tokens sharing 1 - p evenly, the mask never."""
    row = torch.full((VOCAB,), (1 - p) / (VOCAB - 2), dtype=torch.float64)
    row[token], row[M] = p, 0.0
    return row.clamp_min(1e-30).log().float()


def table(*positions: tuple[int, float] | None) -> torch.Tensor:
    """One step's logits [L, V] for a row: position 0 (the row's given id) flat, then one (token, p) per position."""
    rows = [torch.zeros(VOCAB)] + [probs_row(*spec) for spec in positions]
    return torch.stack(rows)


class Scripted(torch.nn.Module):
    """Tells the rows of a batch apart by their given token at position 0 (the row id) and returns, at a row's k-th
    forward, `scripts[id][k]` (its last entry from then on): rows that leave the batch do not shift the others'
    scripts, so one row alone and the same row in a batch see the same logits at the same step."""

    def __init__(self, scripts: dict[int, list[torch.Tensor]]) -> None:
        super().__init__()
        self.scripts = scripts
        self.calls: dict[int, int] = defaultdict(int)

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None, **_: Any) -> torch.Tensor:
        out = []
        for row in tokens:
            key = int(row[0])
            script = self.scripts[key]
            out.append(script[min(self.calls[key], len(script) - 1)])
            self.calls[key] += 1
        return torch.stack(out)


def canvas(*ids: int, answer: int = 5) -> torch.Tensor:
    """Rows of `answer` masked positions after their id token."""
    return torch.tensor([[row_id] + [M] * answer for row_id in ids])


def run(sampler, scripts: dict[int, list[torch.Tensor]], tokens: torch.Tensor, **kwargs):
    counter = ForwardCounter(Scripted(scripts), len(tokens))
    return sampler.sample(counter, tokens, M, **kwargs), counter


def assert_batched_equals_single(sampler, network, batch: torch.Tensor) -> ForwardCounter:
    """Each row of a batched run equals the row run alone (tokens and NFE); givens never change. The batch's counter."""
    counter = ForwardCounter(network, len(batch))
    batched = sampler.sample(counter, batch, MASK)
    assert (batched.tokens != MASK).all() and torch.equal(batched.tokens[batch != MASK], batch[batch != MASK])
    for row in range(len(batch)):
        alone = ForwardCounter(network, 1)
        single = sampler.sample(alone, batch[row : row + 1], MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row]) and alone.nfe.item() == counter.nfe[row].item()
    return counter


# -- hand-worked cases ---------------------------------------------------------------------------------------

STEADY = [(1, 0.95), (2, 0.95), (3, 0.93), (4, 0.92)]  # positions 1-4 never change
CASE = [table(*STEADY, (0, 0.6)), table(*STEADY, (0, 0.6)), table(*STEADY, (0, 0.97)), table(*STEADY, (0, 0.97))]


def test_stable_confident_positions_are_revealed_together_else_the_most_confident() -> None:
    """conf 0.9, KL < 0.01 twice, fallback one. Step 0: no position has a previous step, so none is stable: the
    fallback reveals the most confident, 1 (0.95, tied with 2: the lower position). Step 1: one KL each (0), not two:
    the fallback reveals 2. Step 2: 3 and 4 have had two KLs of 0 and are confident (0.93, 0.92): both; 5 jumps from
    0.6 to 0.97 (KL > 0.01), so it waits although it is the most confident. Step 3: 5 has one small KL only: the
    fallback reveals it. 4 forwards for 5 positions."""
    out, counter = run(KlassSampler(), {0: CASE}, canvas(0))
    assert out.partition(0) == [[1], [2], [3, 4], [5]]
    assert counter.nfe.tolist() == out.steps.tolist() == [4]
    assert out.tokens.tolist() == [[0, 1, 2, 3, 4, 0]]


def test_the_fallback_is_llada_schedule_with_steps() -> None:
    """steps=3 over a block of 5: the schedule reveals 2, 2, then the rest. Step 0: none stable: 1 and 2. Step 1:
    3 and 4 have one KL: the schedule's 2 most confident, 3 and 4. Step 2 is the schedule's last: 5 (unstable)."""
    out, counter = run(KlassSampler(steps=3), {0: CASE}, canvas(0))
    assert out.partition(0) == [[1, 2], [3, 4], [5]] and counter.nfe.item() == 3


def test_history_length_counts_consecutive_small_kls() -> None:
    """history_length 1: one KL below the bound is enough, so at step 1 positions 2-4 are all revealed."""
    out, counter = run(KlassSampler(history_length=1), {0: CASE}, canvas(0))
    assert out.partition(0) == [[1], [2, 3, 4], [5]] and counter.nfe.item() == 3
    # history_length 3: at step 2 positions 3 and 4 have two KLs only, so the fallback takes the most confident, 5
    # (0.97); at step 3 they have three
    out, counter = run(KlassSampler(history_length=3), {0: CASE}, canvas(0))
    assert out.partition(0) == [[1], [2], [5], [3, 4]] and counter.nfe.item() == 4


def loop_probs(logits: torch.Tensor) -> torch.Tensor:
    """The distribution the loop reads at temperature 0: float32 softmax with the mask token ruled out."""
    return logits.float().index_fill(-1, torch.tensor([M]), float("-inf")).softmax(-1)


def test_confidence_must_exceed_the_bound_and_kl_stay_below_it() -> None:
    """Position 4 of the first case: at step 2 its confidence is exactly 0.92 as the loop reads it."""
    at = float(loop_probs(CASE[2])[4].max())
    assert run(KlassSampler(conf_threshold=at - 1e-6), {0: CASE}, canvas(0))[0].partition(0)[2] == [3, 4]
    assert run(KlassSampler(conf_threshold=at), {0: CASE}, canvas(0))[0].partition(0)[2] == [3]  # not > itself
    # KL: positions 1 and 2 drift alike (0.95, 0.951, ...); 3 (0.99 at step 0) goes first. At step 1, with
    # history_length 1, both drifters are stable if their one KL is below the bound: revealed together; at a bound
    # equal to that KL (strict <) neither is, and the fallback takes them one by one
    drift = [table((1, 0.95 + 0.001 * k), (2, 0.95 + 0.001 * k), (3, 0.99 if k == 0 else 0.3)) for k in range(3)]
    kls = [float(kl_to_previous(loop_probs(drift[1])[at], loop_probs(drift[0])[at])) for at in (1, 2)]
    assert all(0.0 < kl < 1e-3 for kl in kls)  # equal but for float32 rounding
    out = run(KlassSampler(kl_threshold=max(kls) * 1.0001, history_length=1), {0: drift}, canvas(0, answer=3))[0]
    assert out.partition(0) == [[3], [1, 2]]
    out = run(KlassSampler(kl_threshold=min(kls), history_length=1), {0: drift}, canvas(0, answer=3))[0]
    assert out.partition(0) == [[3], [1], [2]]


def test_kl_to_previous_by_hand() -> None:
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.75, 0.0])
    assert abs(float(kl_to_previous(p, q)) - (0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0))) < 1e-9
    assert float(kl_to_previous(p, p)) == 0.0


def test_a_positions_history_starts_with_its_block() -> None:
    """Positions 1-4 steady at 0.95. One block: 1 and 2 by the fallback (no history, then one KL), then 3 and 4
    together (two KLs). Blocks of 2: the second block's positions are first read when it starts, so it goes one at
    a time like the first."""
    steady = [table((1, 0.95), (2, 0.95), (3, 0.95), (4, 0.95))]
    out, counter = run(KlassSampler(), {0: steady}, canvas(0, answer=4))
    assert out.partition(0) == [[1], [2], [3, 4]] and counter.nfe.item() == 3
    out, counter = run(KlassSampler(block_length=2), {0: steady}, canvas(0, answer=4))
    assert out.partition(0) == [[1], [2], [3], [4]] and counter.nfe.item() == 4


# -- batching --------------------------------------------------------------------------------------------------


def test_batched_equals_one_row_at_a_time_with_different_scripts() -> None:
    """Three rows that finish at different steps; each row's memory stays its own.

    Row 1 (constant): 1 (0.99) and 3 (0.95) by the fallback, then 4 (0.91, two KLs of 0), then 2 (0.5) and 5 (0.3)
    by the fallback again. Row 2 (changes at step 2): 5 and 4 by the fallback; at step 2 positions 1-3 change (large
    KLs): fallback 1, then 2; then 3. Row 0: the first case."""
    other = [table((4, 0.99), (3, 0.5), (2, 0.95), (1, 0.91), (0, 0.3))]
    late = [table((1, 0.3), (2, 0.4), (3, 0.5), (4, 0.6), (0, 0.7))] * 2 + [table(*STEADY, (0, 0.98))]
    scripts = {0: CASE, 1: other, 2: late}
    singles = [run(KlassSampler(), scripts, canvas(row)) for row in (2, 0, 1)]
    batched, counter = run(KlassSampler(), scripts, canvas(2, 0, 1))
    for index, (single, single_counter) in enumerate(singles):
        assert batched.tokens[index].tolist() == single.tokens[0].tolist()
        assert batched.partition(index) == single.partition(0)
        assert counter.nfe[index].item() == single_counter.nfe.item()
    assert [batched.partition(row) for row in range(3)] == [
        [[5], [4], [1], [2], [3]], [[1], [2], [3, 4], [5]], [[1], [3], [4], [2], [5]]]
    assert counter.nfe.tolist() == [5, 4, 5]


V, MASK, L = 7, 6, 12
real_network = partial(random_transformer, V, L, head_scale=40.0)
prompts = partial(masked_rows, length=L, mask_id=MASK)


@pytest.mark.parametrize("sampler", [
    KlassSampler(), KlassSampler(conf_threshold=0.5, kl_threshold=0.2, history_length=1),
    KlassSampler(steps=3, block_length=4), KlassSampler(conf_threshold=0.6, kl_threshold=0.5, block_length=3),
], ids=repr)
def test_batched_equals_one_row_at_a_time_on_a_real_network(sampler: KlassSampler) -> None:
    network, batch = real_network(), prompts()
    assert_batched_equals_single(sampler, network, batch)


def test_the_real_network_takes_fewer_forwards_than_top_1() -> None:
    """The batched comparisons above cover reveals by stability: on these rows KLASS beats one token per forward."""
    network, batch = real_network(), prompts()
    klass = ForwardCounter(network, len(batch))
    KlassSampler(conf_threshold=0.6, kl_threshold=0.5).sample(klass, batch, MASK)
    top1 = ForwardCounter(network, len(batch))
    TopKSampler(k=1).sample(top1, batch, MASK)
    assert (klass.nfe <= top1.nfe).all() and klass.nfe.sum() < top1.nfe.sum()


# -- configuration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"conf_threshold": 1.0}, r"conf_threshold=1.0 must lie in \[0, 1\)"),
    ({"conf_threshold": -0.1}, r"conf_threshold=-0.1 must lie in \[0, 1\)"),
    ({"kl_threshold": 0.0}, "kl_threshold=0.0 must be > 0"),
    ({"history_length": 0}, "history_length=0 must be >= 1"),
    ({"steps": 0}, "steps=0 must be >= 1"),
    ({"history_length": 1.5}, "history_length"),
    ({"block_length": 0}, "block_length=0 must be >= 1 or null"),
])
def test_bad_settings_are_one_config_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        KlassSampler(**fields)
    assert "\n" not in str(error.value)


def test_the_option_builds_the_defaults_and_names_its_family() -> None:
    assert build(option("sampler", "klass"), "sampler") == KlassSampler()
    sampler = {"_target_": "mdmkit.samplers.KlassSampler", **option("sampler", "klass")}
    assert derive_family({"sampler": sampler}) == "klass-confidence"

"""Prophet against hand-worked cases: a toy network whose logits are scripted per step (test_rule_klass's), so each
step's mean top-2 logit gap over the masked positions, the threshold of its phase, the step that commits and the
NFE are known exactly; commits across blocks; batching; bad settings; the option."""

from __future__ import annotations

import pytest
import torch
from test_rule_klass import MASK, VOCAB, M, assert_batched_equals_single, canvas, prompts, real_network, run

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import (
    CreditSampler,
    ForwardCounter,
    KlassSampler,
    ProphetSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.rules.prophet import mean_gap

pytestmark = pytest.mark.usefixtures("one_thread")


def gaps(*positions: tuple[int, float]) -> torch.Tensor:
    """One step's logits [L, V]: position 0 (the row id) flat; then per position its token `gap` above every other
    real token (logit 0). The mask token gets 50, above all: the gap and the choice must ignore it."""
    rows = [torch.zeros(VOCAB)]
    for token, gap in positions:
        row = torch.zeros(VOCAB)
        row[token] = gap
        rows.append(row)
    out = torch.stack(rows)
    out[:, M] = 50.0
    return out


# step 0: gaps 9 6.5 6 2 2 2; step 1: the revealed position 1 at 30, the rest as before; from step 2: 3-6 at
# 6.5 6.25 5.25 2 (binary fractions: sums and means are exact in float32; no ties for top-1 to break)
CASE = [gaps((1, 9), (2, 6.5), (3, 6), (4, 2), (0, 2), (1, 2)),
        gaps((1, 30), (2, 6.5), (3, 6), (4, 2), (0, 2), (1, 2)),
        gaps((1, 30), (2, 30), (3, 6.5), (4, 6.25), (0, 5.25), (1, 2))]
TOP1 = TopKSampler(k=1)


def test_the_row_commits_once_the_mean_gap_of_its_masked_positions_clears_its_phase() -> None:
    """Base top-1; thresholds 8 / 5 / 3 at progress 0.33 / 0.67 (share of the 6 answer positions revealed).

    Step 0: progress 0, mean gap 27.5/6 = 4.58 < 8: top-1 reveals 1. Step 1: progress 1/6, the masked 2-6 average
    18.5/5 = 3.7 < 8 (the revealed 1, at 30, does not count: with it the mean would be 48.5/6 = 8.08): top-1 reveals
    2. Step 2: progress 2/6 >= 0.33, threshold 5; 3-6 average (6.5 + 6.25 + 5.25 + 2)/4 = 5.0 >= 5: all four at once,
    each its argmax (never the mask, although its logit is the highest). 3 forwards for 6 positions.
    """
    out, counter = run(ProphetSampler(base=TOP1), {0: CASE}, canvas(0, answer=6))
    assert out.partition(0) == [[1], [2], [3, 4, 5, 6]]
    assert counter.nfe.tolist() == out.steps.tolist() == [3]
    assert out.tokens.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    base, base_counter = run(TOP1, {0: CASE}, canvas(0, answer=6))
    assert base.tokens.tolist() == out.tokens.tolist() and base_counter.nfe.item() == 6


def test_the_gap_must_reach_the_threshold_and_the_phase_follows_progress() -> None:
    """At step 2 the mean gap is exactly 5.0: a threshold of 5.001 is not met; nor is 8 when the early phase lasts
    to 0.34 (progress 1/3 is then early). Then step 3 (progress 1/2, 3 to go) averages 13.5/3 = 4.5 < 5, step 4
    (4/6 < 0.67) 7.25/2 < 5, step 5 (late, 3) 2 < 3: no step commits before the last position, 6 forwards."""
    for sampler in (ProphetSampler(base=TOP1, gap_mid=5.001), ProphetSampler(base=TOP1, early_until=0.34)):
        out, counter = run(sampler, {0: CASE}, canvas(0, answer=6))
        assert out.partition(0) == [[1], [2], [3], [4], [5], [6]] and counter.nfe.item() == 6
    # the late phase: from half the answer (mid_until 0.5) the threshold is 2: at step 3 the masked 4-6 average
    # 4.5 >= 2, while the early and middle phases ask for more than any gap
    late = ProphetSampler(base=TOP1, gap_early=100.0, gap_mid=100.0, gap_late=2.0, mid_until=0.5)
    out, counter = run(late, {0: CASE}, canvas(0, answer=6))
    assert out.partition(0) == [[1], [2], [3], [4, 5, 6]] and counter.nfe.item() == 4


def test_a_commit_fills_every_block_at_once() -> None:
    """Blocks of 2 over 6 positions: gaps of 9 everywhere at the first step (>= 8): the row is filled in one
    forward, later blocks included; with a threshold above 9 the base takes one block after another."""
    nine = [gaps((1, 9), (2, 9), (3, 9), (4, 9), (0, 9), (1, 9))]
    blocked = TopKSampler(k=2, block_length=2)
    out, counter = run(ProphetSampler(base=blocked), {0: nine}, canvas(0, answer=6))
    assert out.partition(0) == [[1, 2, 3, 4, 5, 6]] and counter.nfe.item() == 1
    out, counter = run(ProphetSampler(base=blocked, gap_early=9.5, gap_mid=9.5, gap_late=9.5), {0: nine},
                       canvas(0, answer=6))
    assert out.partition(0) == [[1, 2], [3, 4], [5, 6]] and counter.nfe.item() == 3


def test_mean_gap_by_hand() -> None:
    logits = torch.tensor([[[0.0, 3.0, 1.0, 9.0], [2.0, 2.5, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]]])
    # mask token 3: position 0's gap is 3 - 1 = 2 (not 9 - 3), position 1's 0.5; position 2 is not masked
    assert mean_gap(logits, torch.tensor([[True, True, False]]), mask_id=3).tolist() == [1.25]
    assert mean_gap(logits, torch.tensor([[False, False, True]]), mask_id=3).tolist() == [5.0]


# -- batching --------------------------------------------------------------------------------------------------


def test_batched_equals_one_row_at_a_time_with_different_scripts() -> None:
    """Row 0 commits at step 2 (the case above), row 1 at once (gaps 9), row 2 never (gaps 1): its base decides."""
    scripts = {0: CASE, 1: [gaps((1, 9), (2, 9), (3, 9), (4, 9), (0, 9), (1, 9))],
               2: [gaps((1, 1), (2, 1.5), (3, 1), (4, 1), (0, 1), (1, 1))]}
    singles = [run(ProphetSampler(base=TOP1), scripts, canvas(row, answer=6)) for row in (2, 0, 1)]
    batched, counter = run(ProphetSampler(base=TOP1), scripts, canvas(2, 0, 1, answer=6))
    for index, (single, single_counter) in enumerate(singles):
        assert batched.tokens[index].tolist() == single.tokens[0].tolist()
        assert batched.partition(index) == single.partition(0)
        assert counter.nfe[index].item() == single_counter.nfe.item()
    assert counter.nfe.tolist() == [6, 3, 1]


@pytest.mark.parametrize("base", [
    TopKSampler(k=1), StepsSampler(steps=3, block_length=4), ThresholdSampler(tau=0.8, block_length=3),
    KlassSampler(conf_threshold=0.6, kl_threshold=0.5), CreditSampler(tau=0.7),
], ids=lambda base: type(base).__name__)
def test_batched_equals_one_row_at_a_time_on_a_real_network(base) -> None:
    """Thresholds this network's gaps reach now and then (its mean top-2 logit gaps are 0-3.5)."""
    sampler = ProphetSampler(base=base, gap_early=3.0, gap_mid=2.0, gap_late=1.5)
    network, batch = real_network(), prompts()
    counter = assert_batched_equals_single(sampler, network, batch)
    plain = ForwardCounter(network, len(batch))
    base.sample(plain, batch, MASK)
    assert (counter.nfe <= plain.nfe).all() and counter.nfe.sum() < plain.nfe.sum()  # some rows committed early


def test_thresholds_no_gap_reaches_leave_the_base_as_it_is() -> None:
    network, batch = real_network(), prompts()
    for base in (TopKSampler(k=2, block_length=4), KlassSampler(), CreditSampler()):
        never = ProphetSampler(base=base, gap_early=1e9, gap_mid=1e9, gap_late=1e9)
        a, b = ForwardCounter(network, len(batch)), ForwardCounter(network, len(batch))
        out = never.sample(a, batch, MASK)
        ref = base.sample(b, batch, MASK)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.reveal_step, ref.reveal_step)
        assert torch.equal(a.nfe, b.nfe)


# -- configuration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"gap_early": -1.0}, "gap_early=-1.0 must be >= 0"),
    ({"gap_late": -0.5}, "gap_late=-0.5 must be >= 0"),
    ({"early_until": 1.5}, r"early_until=1.5 must lie in \[0, 1\]"),
    ({"early_until": 0.5, "mid_until": 0.4}, r"mid_until=0.4 must lie in \[early_until=0.5, 1\]"),
    ({"base": TopKSampler(block_length=4, cache="dual")}, "cache=dual is not supported under Prophet"),
    ({"base": "topk"}, "base"),
])
def test_bad_settings_are_one_config_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        ProphetSampler(**fields)
    assert "\n" not in str(error.value)


def test_the_option_builds_the_defaults_and_names_its_family() -> None:
    """The option: LLaDA's schedule (32 steps per block of 32) under the paper's thresholds."""
    sampler = build(option("sampler", "prophet"), "sampler")
    assert sampler == ProphetSampler() and sampler.base == StepsSampler(steps=32, block_length=32, mask_in_softmax=True)
    assert (sampler.gap_early, sampler.gap_mid, sampler.gap_late) == (8.0, 5.0, 3.0)
    config = {"_target_": "mdmkit.samplers.ProphetSampler", **option("sampler", "prophet")}
    config["base"] = {"_target_": "mdmkit.samplers.StepsSampler", **config["base"]}
    assert derive_family({"sampler": config}) == "prophet-steps-confidence"

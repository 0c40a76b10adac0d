"""The sampler library against exact math: hand-computed budgets, toy networks with known joints, batching."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from fakes import Independent, LeftToRight, random_transformer

from mdmkit.core.config import build
from mdmkit.core.errors import ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.samplers import (
    CreditSampler,
    DreamStepsSampler,
    DUSSampler,
    EBSampler,
    FactorSampler,
    FastDllmFactorSampler,
    ForwardCounter,
    KlassSampler,
    ProphetSampler,
    RevealAllSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
    WinoSampler,
)
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.rules.eb import EntropyBound
from mdmkit.samplers.rules.factor import ConfidenceFactor
from mdmkit.samplers.rules.slowfast import SlowFastSampler
from mdmkit.samplers.rules.steps import DreamSchedule, StepSchedule
from mdmkit.samplers.rules.threshold import ConfidenceThreshold

CONF = Path(__file__).resolve().parents[1] / "conf"


def ranked(entropy: list[float] | None = None, confidence: list[float] | None = None, **state: int) -> Ranked:
    values = entropy if entropy is not None else confidence
    n = len(values)
    return Ranked(
        entropy=torch.tensor([entropy or [0.0] * n]),
        confidence=torch.tensor([confidence or [0.0] * n]),
        n_eligible=torch.tensor([state.get("n_eligible", n)]),
        step_in_block=torch.tensor([state.get("step", 0)]),
        block_size=torch.tensor([state.get("block_size", n)]),
    )


# -- budget rules on hand-computed numbers ---------------------------------------------------------


def test_entropy_bound_matches_the_formula_by_hand() -> None:
    entropies = [0.2, 0.05, 0.1, 0.3, 0.01]
    # prefix sums 0.2 0.25 0.35 0.65 0.66; running max 0.2 0.2 0.2 0.3 0.3 -> excess 0 0.05 0.15 0.35 0.36
    expected = {0.0: 1, 0.04: 1, 0.06: 2, 0.14: 2, 0.16: 3, 0.34: 3, 0.355: 4, 0.365: 5, math.inf: 5}
    for gamma, count in expected.items():
        assert EntropyBound(gamma)(ranked(entropies)).item() == count, gamma


def test_entropy_bound_stops_at_the_eligible_positions() -> None:
    assert EntropyBound(math.inf)(ranked([0.1, 0.1, 0.1, 0.1], n_eligible=2)).item() == 2


def test_threshold_and_factor_rules_by_hand() -> None:
    conf = [0.99, 0.95, 0.9, 0.6, 0.5]
    assert ConfidenceThreshold(0.9)(ranked(confidence=conf)).item() == 3
    assert ConfidenceThreshold(0.999)(ranked(confidence=conf)).item() == 0  # the loop still reveals one
    # (n + 1)(1 - c_n): 2*0.01=0.02, 3*0.05=0.15, 4*0.1=0.4, 5*0.4=2.0, 6*0.5=3.0
    assert ConfidenceFactor(0.4)(ranked(confidence=conf)).item() == 2  # strict: 0.4 < 0.4 fails
    assert ConfidenceFactor(1.0)(ranked(confidence=conf)).item() == 3
    assert ConfidenceFactor(10.0)(ranked(confidence=conf)).item() == 5


def test_step_schedules_by_hand() -> None:
    counts = [StepSchedule(4)(ranked([0.0] * 10, block_size=10, step=i)).item() for i in range(3)]
    assert counts == [3, 3, 2]
    assert StepSchedule(4)(ranked([0.0] * 2, block_size=10, step=3)).item() == 2  # the last step takes the rest
    times = torch.linspace(1.0, 1e-3, 5, dtype=torch.float64)
    expected = int(20 * (1 - times[2] / times[1]))
    assert DreamSchedule(4)(ranked([0.0] * 20, step=1)).item() == expected
    assert DreamSchedule(4)(ranked([0.0] * 7, step=3)).item() == 7


# -- toy networks --------------------------------------------------------------------------------


class Copy(torch.nn.Module):
    """The exact conditionals of x1 = x2 ~ Uniform{0, 1}: uniform while both are masked, else a copy."""

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.zeros(tokens.shape[0], 2, 3)
        logits[..., 2] = -1e9  # token 2 is the mask
        for pos in range(2):
            other = tokens[:, 1 - pos]
            known = other != 2
            logits[known, pos, :2] = -1e9
            logits[known, pos, other[known]] = 0.0
        return logits


def sample(sampler, network, prompts, mask_id, seed=0, **kwargs):
    counter = ForwardCounter(network, prompts.shape[0])
    generator = torch.Generator().manual_seed(seed)
    return sampler.sample(counter, prompts, mask_id, generator, **kwargs), counter


@pytest.mark.parametrize(
    "sampler",
    [TopKSampler(k=2, temperature=1.0), TopKSampler(k=1, temperature=1.0, ordering="random"),
     EBSampler(gamma=0.5, temperature=1.0, ordering="entropy")],
    ids=["top2", "random-order", "eb"],
)
def test_temperature_one_reproduces_a_known_factorized_joint(sampler) -> None:
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    n = 20_000
    out, _ = sample(sampler, Independent(probs, 3), torch.full((n, 2), 3), 3, seed=1)
    joint = torch.zeros(3, 3)
    joint.index_put_((out.tokens[:, 0], out.tokens[:, 1]), torch.ones(n), accumulate=True)
    expected = probs[0][:, None] * probs[1][None, :]
    # binomial standard error of each cell is <= 0.0036 at n = 20k: 0.015 is over 4 sigma
    assert (joint / n - expected).abs().max() < 0.015


def test_top_k_shows_the_joint_dependence_error_and_eb_does_not() -> None:
    prompts = torch.full((4000, 2), 2)
    top2, _ = sample(TopKSampler(k=2, temperature=1.0), Copy(), prompts, 2, seed=3)
    mismatch = (top2.tokens[:, 0] != top2.tokens[:, 1]).float().mean().item()
    assert abs(mismatch - 0.5) < 0.04  # both revealed independently: half the pairs disagree
    eb, counter = sample(EBSampler(gamma=0.1, temperature=1.0), Copy(), prompts, 2, seed=3)
    assert (eb.tokens[:, 0] == eb.tokens[:, 1]).all()  # ln 2 > gamma: one at a time, the second is a copy
    assert counter.nfe.tolist() == [2] * 4000
    assert abs((eb.tokens[:, 0] == 0).float().mean().item() - 0.5) < 0.04


# -- the loop ------------------------------------------------------------------------------------

V, MASK, L = 7, 6, 10


real_network = partial(random_transformer, V, L)


def puzzles(rows: int = 6) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, MASK, (rows, L), generator=generator)
    for row in range(rows):
        prompts[row, torch.randperm(L, generator=generator)[: row + 3]] = MASK
    return prompts


SAMPLERS = [
    TopKSampler(k=2),
    TopKSampler(k=1, ordering="margin"),
    StepsSampler(steps=3, block_length=4),
    DreamStepsSampler(steps=4, ordering="entropy"),
    DreamStepsSampler(steps=5, ordering="entropy", entropy_eps=1e-10, empty_steps=True, mask_in_softmax=True),
    EBSampler(gamma=0.5),
    EBSampler(gamma=2.0, ordering="entropy", block_length=3),
    ThresholdSampler(tau=0.3),
    FactorSampler(factor=2.0),
    FastDllmFactorSampler(factor=2.0, block_length=3),
    RevealAllSampler(block_length=2),
    DUSSampler(),
    DUSSampler(base=3, block_length=4, defer_below=0.3),
    WinoSampler(tau_in=0.3, tau_out=0.5, draft_floor=1),
    WinoSampler(block_length=4, draft_floor=2, draft_cap=3),
    SlowFastSampler(),
    SlowFastSampler(block_length=4, high_confidence=0.3, explore_steps=2, span_cache=True),
    KlassSampler(conf_threshold=0.3, kl_threshold=0.05),
    KlassSampler(block_length=4, steps=3, history_length=1),
    CreditSampler(tau=0.4),
    CreditSampler(tau=0.6, block_length=3, fusion_weight=2.0),
    ProphetSampler(base=TopKSampler(k=1), gap_early=1.0, gap_mid=0.5, gap_late=0.2),
    ProphetSampler(base=EBSampler(gamma=0.5, block_length=4)),
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
def test_batched_equals_one_row_at_a_time(sampler) -> None:
    network, prompts = real_network(), puzzles()
    batched, counter = sample(sampler, network, prompts, MASK)
    assert (batched.tokens != MASK).all()
    assert torch.equal(batched.tokens[prompts != MASK], prompts[prompts != MASK])  # givens never change
    for row in range(len(prompts)):
        single, single_counter = sample(sampler, network, prompts[row : row + 1], MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert single_counter.nfe.item() == counter.nfe[row].item() == batched.steps[row].item()


def test_every_step_reveals_at_least_one_and_reveal_steps_form_a_partition() -> None:
    network, prompts = real_network(), puzzles()
    out, counter = sample(ThresholdSampler(tau=1.0), network, prompts, MASK)  # never confident: one per step
    assert counter.nfe.tolist() == (prompts == MASK).sum(1).tolist()
    for row in range(len(prompts)):
        groups = out.partition(row)
        assert all(len(g) == 1 for g in groups)
        assert sorted(i for group in groups for i in group) == torch.nonzero(prompts[row] == MASK).flatten().tolist()


def test_eb_with_gamma_zero_is_full_step_and_gamma_infinite_is_one_shot() -> None:
    network, prompts = real_network(), puzzles()
    _, zero = sample(EBSampler(gamma=0.0), network, prompts, MASK)  # a random network: no zero-entropy token
    assert zero.nfe.tolist() == (prompts == MASK).sum(1).tolist()
    _, infinite = sample(EBSampler(gamma=math.inf), network, prompts, MASK)
    assert infinite.nfe.tolist() == [1] * len(prompts)


def test_same_seed_same_output_and_temperature_zero_is_argmax() -> None:
    network, prompts = real_network(), puzzles()
    first, _ = sample(EBSampler(gamma=1.0, temperature=1.0), network, prompts, MASK, seed=7)
    again, _ = sample(EBSampler(gamma=1.0, temperature=1.0), network, prompts, MASK, seed=7)
    assert torch.equal(first.tokens, again.tokens)
    once, _ = sample(RevealAllSampler(), network, prompts, MASK)
    logits = network(prompts)
    logits[..., MASK] = -math.inf
    masked = prompts == MASK
    assert torch.equal(once.tokens[masked], logits.argmax(-1)[masked])


def test_top_p_keeps_only_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out, _ = sample(TopKSampler(temperature=1.0, top_p=0.7), Independent(probs, 4), torch.full((3000, 1), 4), 4)
    drawn = torch.bincount(out.tokens[:, 0], minlength=4).float() / 3000
    assert drawn[2:].sum() == 0  # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are outside the nucleus
    assert abs(drawn[0].item() - 0.5 / 0.8) < 0.04


def test_blocks_are_decoded_in_order() -> None:
    confidence = torch.tensor([0.5, 0.9, 0.3, 0.8, 0.95, 0.6])
    probs = torch.stack([torch.tensor([c, 1 - c]) for c in confidence])
    network = Independent(probs, 2)
    out, counter = sample(TopKSampler(k=1, block_length=2), network, torch.full((1, 6), 2), 2)
    assert out.partition(0) == [[1], [0], [3], [2], [4], [5]]  # by confidence inside each block of two
    out, counter = sample(RevealAllSampler(block_length=4), network, torch.full((1, 6), 2), 2)
    assert out.partition(0) == [[0, 1, 2, 3], [4, 5]] and counter.nfe.item() == 2


def test_blocks_count_answer_positions_not_raw_positions() -> None:
    probs = torch.full((6, 2), 0.5)
    prompt = torch.tensor([[2, 0, 2, 2, 1, 2]])  # answer positions 0, 2, 3, 5
    out, _ = sample(RevealAllSampler(block_length=2), Independent(probs, 2), prompt, 2)
    assert out.partition(0) == [[0, 2], [3, 5]]


def test_generate_until_stops_a_row_once_its_stop_token_and_everything_before_are_revealed() -> None:
    stop_id, mask = 4, 5
    network = LeftToRight([1, 2, 3, stop_id, 0, 0, 0, 0], vocab=6)
    prompts = torch.tensor([[1] + [mask] * 7, [mask] * 8])
    stop = StopCondition.of([stop_id])
    out, counter = sample(TopKSampler(k=1), network, prompts, mask, stop=stop)
    assert out.tokens[0, :4].tolist() == [1, 2, 3, stop_id] and (out.tokens[0, 4:] == mask).all()
    assert counter.nfe.tolist() == [3, 4] and counter.nfe_at_stop.tolist() == [3, 4]
    full, counter = sample(TopKSampler(k=1, stop_early=False), network, prompts, mask, stop=stop)
    assert (full.tokens != mask).all()
    assert counter.nfe.tolist() == [7, 8] and counter.nfe_at_stop.tolist() == [3, 4]


def test_a_stop_token_with_masked_positions_before_it_does_not_stop() -> None:
    stop = StopCondition.of([[3, 4]])
    tokens = torch.tensor([[1, 9, 3, 4, 9], [1, 2, 3, 4, 9], [1, 2, 3, 9, 4]])
    answer = torch.ones_like(tokens, dtype=torch.bool)
    assert stop.met(tokens, answer, mask_id=9).tolist() == [False, True, False]


def test_padding_is_invisible_to_the_network() -> None:
    network = real_network()
    prompt = puzzles(1)
    prompt[0, :3] = 0  # three padding positions the network must not see
    keep = torch.ones_like(prompt, dtype=torch.bool)
    keep[0, :3] = False
    other = prompt.clone()
    other[0, :3] = 4  # different padding content
    a, _ = sample(TopKSampler(k=2), network, prompt, MASK, attention_mask=keep)
    b, _ = sample(TopKSampler(k=2), network, other, MASK, attention_mask=keep)
    assert torch.equal(a.tokens[0, 3:], b.tokens[0, 3:])
    both, _ = sample(TopKSampler(k=2), network, torch.cat([prompt, puzzles(2)[1:]]), MASK,
                     attention_mask=torch.cat([keep, torch.ones(1, L, dtype=torch.bool)]))
    assert torch.equal(both.tokens[0], a.tokens[0])  # batched with an unpadded row, same result


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "sampler").glob("*.yaml")))
def test_every_sampler_config_builds(option: str) -> None:
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={option}"]).sampler, "sampler")
    assert callable(sampler.sample)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: EBSampler(gamma=-0.1), "gamma=-0.1 must be >= 0"),
        (lambda: TopKSampler(k=0), "k=0 must be >= 1"),
        (lambda: ThresholdSampler(tau=0.0), r"tau=0.0 must lie in \(0, 1\]"),
        (lambda: ThresholdSampler(tau=1.5), r"tau=1.5 must lie in \(0, 1\]"),
        (lambda: FactorSampler(factor=0.0), "factor=0.0 must be > 0"),
        (lambda: FastDllmFactorSampler(factor=-1.0), "factor=-1.0 must be > 0"),
        (lambda: DreamStepsSampler(random_count=True, ordering="entropy"), "random_count=true needs ordering=random"),
        (lambda: TopKSampler(ordering="loss"), "ordering='loss' is not one of confidence, entropy, margin, random"),
        (lambda: StepsSampler(steps=0), "steps=0 must be >= 1"),
        (lambda: TopKSampler(block_length=0), "block_length=0 must be >= 1"),
        (lambda: TopKSampler(top_p=0.0), r"top_p=0.0 must lie in \(0, 1\]"),
        (lambda: DUSSampler(base=0), "base=0 must be >= 1"),
        (lambda: DUSSampler(defer_below=1.5), r"defer_below=1.5 must lie in \[0, 1\]"),
        (lambda: DUSSampler(cache="dual"), "cache=dual needs block_length"),
        (lambda: WinoSampler(tau_in=-0.1), r"tau_in=-0.1 must lie in \[0, 1\]"),
        (lambda: WinoSampler(draft_share=0.0), r"draft_share=0.0 must lie in \(0, 1\]"),
        (lambda: WinoSampler(draft_cap=0), "draft_cap=0 must be >= 1 or null"),
        (lambda: WinoSampler(cache="prefix", block_length=4), "cache=prefix is not supported by WINO"),
        (lambda: SlowFastSampler(explore_steps=0), "explore_steps=0 must be >= 1"),
    ],
)
def test_bad_sampler_settings_are_one_clear_error(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_bad_sampler_value_from_the_command_line_names_the_group() -> None:
    cfg = compose_config("evaluate", ["ckpt=x.pt", "sampler=eb", "sampler.gamma=-1"])
    with pytest.raises(ConfigError, match="sampler: gamma=-1 must be >= 0"):
        build(cfg.sampler, "sampler")

"""`fastdllm_factor` (Fast-dLLM's factor rule as its code applies it) against exact math, and against `factor`.

`code_count` below re-states, for one row, how `get_transfer_index_dynamic` (NVlabs/Fast-dLLM,
llada/generate.py) decides how many of a block's masked positions one step reveals; `paper_count` is the
paper's rule. Both are written from the reference, apart from mdmkit's batched budget rules, so they can disagree.
"""

from __future__ import annotations

import pytest
import torch
from fakes import FixedConfidence, FixedLogits, masked_rows, random_transformer

from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import FactorSampler, FastDllmFactorSampler, ForwardCounter
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.rules.factor import ConfidenceFactor, FastDllmFactor

pytestmark = pytest.mark.usefixtures("one_thread")


def code_count(ranked: list[float], factor: float) -> int:
    """Fast-dLLM's code: the n-th best (1-based) passes if c >= 1 - f / (n + 1), the best one always; reveal the
    leading passes, and when they leave exactly one position behind, that one as well."""
    passed = 1
    while passed < len(ranked) and ranked[passed] >= 1 - factor / (passed + 2):
        passed += 1
    return len(ranked) if passed == len(ranked) - 1 else passed


def paper_count(ranked: list[float], factor: float) -> int:
    """The paper: the largest n with (n + 1)(1 - c_(n)) < f (none: 0, and the loop reveals one)."""
    return max([0] + [n for n, c in enumerate(ranked, start=1) if (n + 1) * (1 - c) < factor])


def as_ranked(rows: list[list[float]], width: int | None = None) -> Ranked:
    """Ranked confidences (float32, as the loop has them), one row per list, padded with zeros."""
    width = width or max(len(row) for row in rows)
    confidence = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        confidence[i, : len(row)] = torch.tensor(row)
    n = torch.tensor([len(row) for row in rows])
    return Ranked(entropy=torch.zeros_like(confidence), confidence=confidence, n_eligible=n,
                  step_in_block=torch.zeros_like(n), block_size=n)


# -- by hand -------------------------------------------------------------------------------------------


def test_all_but_the_last_passing_reveals_the_last_too() -> None:
    # f = 1, bars 1 - 1/(n+1): n=2: 0.667, n=3: 0.75. 0.7 passes, 0.5 fails; it is the last one, so it comes too.
    # The paper: 2 * 0.1 = 0.2 < 1, 3 * 0.3 = 0.9 < 1, 4 * 0.5 = 2 >= 1: two.
    conf = [0.9, 0.7, 0.5]
    assert code_count(conf, 1.0) == 3 and paper_count(conf, 1.0) == 2
    assert FastDllmFactor(1.0)(as_ranked([conf])).item() == 3
    assert ConfidenceFactor(1.0)(as_ranked([conf])).item() == 2
    # with a fourth, weaker position the run stops two short of the end: no extra reveal
    assert FastDllmFactor(1.0)(as_ranked([[*conf, 0.4]])).item() == 2


def test_two_masked_positions_are_always_revealed_together() -> None:
    # the best passes by rule, which leaves one behind: both go, however unsure (the paper's rule reveals one)
    for conf in ([0.3, 0.2], [0.99, 0.01], [0.5, 0.5]):
        assert FastDllmFactor(0.5)(as_ranked([conf])).item() == code_count(conf, 0.5) == 2
    assert ConfidenceFactor(0.5)(as_ranked([[0.3, 0.2]])).item() == 0  # the loop then reveals one
    assert FastDllmFactor(0.5)(as_ranked([[0.3]])).item() == 1


def test_a_confidence_on_the_bar_passes_in_the_code_and_fails_in_the_paper() -> None:
    # n = 3, f = 1: the bar is 1 - 1/4 = 0.75 exactly; (3 + 1)(1 - 0.75) = 1 is not < 1
    conf = [0.95, 0.9, 0.75, 0.1, 0.05]
    assert FastDllmFactor(1.0)(as_ranked([conf])).item() == code_count(conf, 1.0) == 3
    assert ConfidenceFactor(1.0)(as_ranked([conf])).item() == paper_count(conf, 1.0) == 2


def test_the_best_ranked_position_always_passes_under_another_ordering() -> None:
    # ranked by entropy, not confidence: the first is unsure, the next two are sure
    conf = [0.3, 0.95, 0.9, 0.2, 0.1]
    assert FastDllmFactor(1.0)(as_ranked([conf])).item() == code_count(conf, 1.0) == 3
    assert ConfidenceFactor(1.0)(as_ranked([conf])).item() == 0


# -- against the re-statement, on many random confidence vectors -------------------------------------------


def random_vectors(generator: torch.Generator, factor: float, count: int) -> list[list[float]]:
    """Sorted float32 confidences: uniform, near one, and on the bars 1 - f / (n + 1) and their neighbours."""
    rows = []
    for _ in range(count):
        m = int(torch.randint(1, 13, (1,), generator=generator))
        kind = int(torch.randint(0, 3, (1,), generator=generator))
        if kind == 0:
            values = torch.rand(m, generator=generator)
        elif kind == 1:
            values = 1 - torch.rand(m, generator=generator) ** 4 * 0.3
        else:
            n = torch.arange(1, m + 1, dtype=torch.float64)
            bars = (1 - factor / (n + 1)).float().clamp(0, 1)
            step = torch.randint(-1, 2, (m,), generator=generator).float()
            values = torch.nextafter(bars, bars + step).clamp(0, 1) if bool(step.any()) else bars
        rows.append(values.sort(descending=True).values.tolist())
    return rows


@pytest.mark.parametrize("factor", [0.3, 1.0, 1.9, 3.0])
def test_the_budget_rule_counts_as_the_code_on_random_vectors(factor: float) -> None:
    rows = random_vectors(torch.Generator().manual_seed(int(factor * 10)), factor, 3000)
    counts = FastDllmFactor(factor)(as_ranked(rows, width=16)).tolist()  # padding past each row's positions
    assert counts == [code_count(row, factor) for row in rows]
    assert counts != [max(1, paper_count(row, factor)) for row in rows]  # they reach where the two rules part


def code_reveals(logits: torch.Tensor, mask_id: int, factor: float) -> set[int]:
    """Positions one step of Fast-dLLM's code reveals, from one row's logits [L, V] (every position masked, the mask
    token never the argmax): its argmax's probability under the softmax over every token, in float64."""
    probs = logits.double().softmax(-1)
    assert not bool((probs.argmax(-1) == mask_id).any())
    confidence = probs.max(-1).values
    order = confidence.argsort(descending=True, stable=True)
    return set(order[: code_count(confidence[order].tolist(), factor)].tolist())


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.5])
def test_the_sampler_reveals_the_same_set_as_the_code(factor: float) -> None:
    generator = torch.Generator().manual_seed(7)
    length, vocab = 10, 6
    for _ in range(100):
        scale = float(torch.rand(1, generator=generator)) * 12
        logits = torch.randn(length, vocab, generator=generator) * scale
        logits[:, -1] = logits[:, :-1].min(-1).values  # the mask keeps a share, never the argmax
        out = FastDllmFactorSampler(factor=factor, block_length=None).sample(
            ForwardCounter(FixedLogits(logits), 1), torch.full((1, length), vocab - 1), vocab - 1)
        first = set(torch.nonzero(out.reveal_step[0] == 0).flatten().tolist())
        assert first == code_reveals(logits, vocab - 1, factor)


def test_factor_and_fastdllm_factor_reveal_different_sets_on_one_network() -> None:
    net = FixedConfidence([0.9, 0.7, 0.5])
    for sampler, first in ((FactorSampler(factor=1.0), [0, 1]), (FastDllmFactorSampler(factor=1.0), [0, 1, 2])):
        out = sampler.sample(ForwardCounter(net, 1), torch.full((1, 3), net.mask_id), net.mask_id)
        assert torch.nonzero(out.reveal_step[0] == 0).flatten().tolist() == first


# -- the sampler ------------------------------------------------------------------------------------------


def test_batched_equals_one_row_at_a_time() -> None:
    vocab, mask, length = 7, 6, 10
    network = random_transformer(vocab, length, head_scale=6.0)
    prompts = masked_rows(seed=3, length=length, mask_id=mask)
    sampler = FastDllmFactorSampler(factor=1.5, block_length=3)
    counter = ForwardCounter(network, 6)
    batched = sampler.sample(counter, prompts, mask)
    assert (batched.tokens != mask).all()
    for row in range(6):
        single_counter = ForwardCounter(network, 1)
        single = sampler.sample(single_counter, prompts[row : row + 1], mask)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert single_counter.nfe.item() == counter.nfe[row].item()


def test_the_preset_is_the_class_defaults_and_bad_values_are_one_line() -> None:
    assert build(option("sampler", "fastdllm_factor"), "sampler") == FastDllmFactorSampler()
    assert FastDllmFactorSampler().block_length == 32 and FactorSampler().block_length is None
    with pytest.raises(ConfigError, match="factor=0.0 must be > 0"):
        FastDllmFactorSampler(factor=0.0)

"""SlowFast sampling against hand-worked cases: a toy network whose confidences are scripted per step, so the
positions each slow and fast step reveals, the predicted span ends and the NFE are known exactly; a re-statement of
the reference code's loop on random networks; batching, out-of-span caching, stop conditions, padding and settings."""

from __future__ import annotations

import math
import statistics
from functools import partial
from typing import Any

import pytest
import torch
from fakes import masked_rows, random_transformer

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.samplers import ForwardCounter
from mdmkit.samplers.rules.slowfast import SlowFastSampler, block_offsets

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, M = 6, 5  # tokens 0..4, the mask is 5
_ = 0.1  # a scripted confidence that no rule below reacts to


class Scripted(torch.nn.Module):
    """Row r's canvas starts with a given token, its id; the k-th forward that row takes part in gives answer position
    i (canvas position i + 1) confidence `scripts[id][k][i]` (the last entry repeats) on token (i + 1 + id) % 5, the
    rest of the mass spread over the other real tokens, none on the mask. Any width is accepted (a cut forward); every
    call's tokens and attn_mask are kept in `seen`."""

    def __init__(self, scripts: dict[int, list[list[float]]]) -> None:
        super().__init__()
        self.scripts = scripts
        self.calls: dict[int, int] = {}
        self.seen: list[tuple[torch.Tensor, Any]] = []

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None) -> torch.Tensor:
        self.seen.append((tokens.clone(), None if attn_mask is None else attn_mask.clone()))
        rows, width = tokens.shape
        conf = torch.full((rows, width), _, dtype=torch.float64)
        conf[:, 0] = 0.5
        for row in range(rows):
            ident = int(tokens[row, 0])
            step = self.calls.get(ident, 0)
            self.calls[ident] = step + 1
            script = self.scripts[ident][min(step, len(self.scripts[ident]) - 1)][: width - 1]
            conf[row, 1 : 1 + len(script)] = torch.tensor(script, dtype=torch.float64)
        target = (torch.arange(width)[None, :] + tokens[:, :1]) % 5
        probs = ((1 - conf) / (VOCAB - 2))[..., None].repeat(1, 1, VOCAB)
        probs.scatter_(-1, target[..., None], conf[..., None])
        probs[..., M] = 0.0
        return probs.clamp_min(1e-30).log()


def canvas(ident: int, blanks: int) -> torch.Tensor:
    row = torch.full((1, blanks + 1), M)
    row[0, 0] = ident
    return row


def run(sampler: SlowFastSampler, network: torch.nn.Module, tokens: torch.Tensor, mask: int = M, **kwargs):
    counter = ForwardCounter(network, len(tokens))
    return sampler.sample(counter, tokens, mask, **kwargs), counter


# -- hand-worked cases ---------------------------------------------------------------------------------------

# K = 3 slow steps, tau_min 0.3, tau_high 0.9, window 2, variance < 1 (answer offsets 0..7 = canvas positions 1..8)
FIRST = [
    [0.5, 0.4, 0.35, 0.2, _, _, _, _],  # end guess 3 (offset 2 is the farthest >= 0.3); reveal the best: 0
    [_, 0.6, 0.5, 0.45, 0.35, _, _, _],  # guess 5: window (3, 5), variance 1, not < 1: unstable; reveal 1
    [_, _, 0.95, 0.92, 0.5, 0.35, _, 0.2],  # guess 6: window (5, 6), variance 0.25: the span is [0, 6); reveal 2, 3
    [_, _, _, _, 0.7, 0.8, 0.99, 0.99],  # fast: only the span's masks 4, 5 count: the best, 5 (6, 7 wait)
    [_, _, _, _, 0.6, _, 0.99, 0.99],  # fast: 4; the span is full
    [_, _, _, _, _, _, 0.95, 0.91],  # the next cycle starts at 6, slow: 6 and 7 above tau_high, both revealed
]
FIRST_SAMPLER = SlowFastSampler(explore_steps=3, min_confidence=0.3, high_confidence=0.9)


def test_a_slow_phase_finds_the_span_and_the_fast_phase_fills_only_it() -> None:
    net = Scripted({0: FIRST})
    out, counter = run(FIRST_SAMPLER, net, canvas(0, 8))
    assert out.partition(0) == [[1], [2], [3, 4], [6], [5], [7, 8]]
    assert counter.nfe.tolist() == out.steps.tolist() == [6]
    assert out.tokens.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]  # position p holds p % 5 (id 0)
    assert all(mask is None for _, mask in net.seen) and counter.tokens.item() == 6 * 9


def test_without_stability_the_span_ends_at_the_floor_of_the_mean_and_a_full_span_costs_no_forward() -> None:
    """K = 2. Guesses 3 and 6: variance 2.25, so after the slow phase the span is [0, floor(4.5)) = [0, 4). Fast: 3
    then 2. Next cycle at 4: guesses 6 then 8 (variance exactly 1, not < 1): span [4, 7), but the slow steps have
    revealed 4, 5 and 6 already, so the span is full without a forward; the cycle at 7 reveals 7."""
    script = [
        [0.5, 0.4, 0.35, 0.2, _, _, _, _],
        [_, 0.6, 0.4, 0.4, 0.35, 0.4, _, _],
        [_, _, 0.5, 0.7, 0.99, 0.99, 0.99, 0.99],
        [_, _, 0.6, _, 0.99, 0.99, 0.99, 0.99],
        [_, _, _, _, 0.99, 0.95, 0.2, _],
        [_, _, _, _, _, _, 0.5, 0.4],
        [_, _, _, _, _, _, _, 0.3],
    ]
    out, counter = run(SlowFastSampler(explore_steps=2, min_confidence=0.3, high_confidence=0.9),
                       Scripted({0: script}), canvas(0, 8))
    assert out.partition(0) == [[1], [2], [4], [3], [5, 6], [7], [8]]
    assert counter.nfe.item() == 7


CODE_OR_PAPER = [
    [0.5, 0.4, 0.35, _, _, 0.2],  # guess 3
    [_, 0.6, 0.4, 0.2, _, 0.2],  # guess 3 again: stable, the span is [0, 3)
    [_, _, 0.5, 0.45, 0.4, 0.8],
    [_, _, 0.5, 0.7, 0.4, _],
    [_, _, 0.6, _, 0.9, _],
    [_, _, _, _, 0.5, _],
]


def test_the_slow_phase_takes_all_its_steps_by_default_and_the_settled_end_no_longer_moves() -> None:
    """K = 4: stable after step 2 (span [0, 3)); steps 3 and 4 stay slow (the code), reveal the best masked
    position of the block, 5 then 3, whatever lies past the span, and the end stays 3 although step 3 would guess
    5. Fast: 2 (4 is above tau_high but outside the span). Then 4."""
    sampler = SlowFastSampler(explore_steps=4, min_confidence=0.3, high_confidence=0.9)
    out, counter = run(sampler, Scripted({0: CODE_OR_PAPER}), canvas(0, 6))
    assert out.partition(0) == [[1], [2], [6], [4], [3], [5]] and counter.nfe.item() == 6


def test_explore_until_stable_starts_the_fast_phase_once_the_end_is_settled() -> None:
    """The paper's text: step 3 is already fast (span [0, 3): 2). The cycle at 3: guesses 5, 5 (stable) while 3
    and then 4 (0.9, one above tau_high) are revealed; the span [3, 5) is then full, and the cycle at 5 reveals 5."""
    sampler = SlowFastSampler(explore_steps=4, min_confidence=0.3, high_confidence=0.9, explore_until_stable=True)
    out, counter = run(sampler, Scripted({0: CODE_OR_PAPER}), canvas(0, 6))
    assert out.partition(0) == [[1], [2], [3], [4], [5], [6]] and counter.nfe.item() == 6


def test_slow_k_and_fast_k_are_floors_under_the_threshold() -> None:
    """slow_k = 2: one position above tau_high (2) and the next best (0) are revealed; then three above tau_high
    (more than 2): all three."""
    script = [
        [0.5, 0.4, 0.95, 0.1, _, _],  # guess 3 (2 is the farthest >= 0.3)
        [_, 0.95, _, 0.97, 0.96, 0.35],  # guess 6: window (3, 6) unstable; K = 2: span [0, floor(4.5)) = [0, 4)
        [_, _, _, _, _, 0.2],
    ]
    sampler = SlowFastSampler(explore_steps=2, min_confidence=0.3, high_confidence=0.9, slow_k=2)
    out, counter = run(sampler, Scripted({0: script}), canvas(0, 6))
    assert out.partition(0) == [[1, 3], [2, 4, 5], [6]] and counter.nfe.item() == 3  # the span [0, 4) was full


FAST_K = [[0.5, 0.4, 0.35, 0.2], [_, 0.4, 0.35, 0.99], [_, _, 0.5, 0.5]]  # K = W = 1: the first guess is the end


def test_fast_k_reveals_the_best_of_the_span_when_too_few_are_above_the_threshold() -> None:
    """Guess 3 (2 is the farthest >= 0.3), 0 revealed; fast on [0, 3): 1 and 2 are below tau_high, fast_k = 2
    reveals both (3 at 0.99 lies past the span); the cycle at 3 reveals 3. With fast_k = 1: 1, then 2."""
    sampler = SlowFastSampler(explore_steps=1, window=1, min_confidence=0.3, high_confidence=0.9, fast_k=2)
    out, counter = run(sampler, Scripted({0: FAST_K}), canvas(0, 4))
    assert out.partition(0) == [[1], [2, 3], [4]] and counter.nfe.item() == 3
    out, counter = run(replace_field(sampler, fast_k=1), Scripted({0: FAST_K}), canvas(0, 4))
    assert out.partition(0) == [[1], [2], [3], [4]] and counter.nfe.item() == 4


def test_with_nothing_confident_enough_the_span_ends_one_past_the_cycle_start() -> None:
    """tau_min 0.6: the first guess finds nothing, so the span is [0, 1), full once 0 is revealed: the next cycle
    starts at 1 without a fast forward. Its slow step reveals 3 (0.99) and guesses 4; fast on [1, 4): 2, then 1."""
    sampler = SlowFastSampler(explore_steps=1, window=1, min_confidence=0.6, high_confidence=0.9)
    out, counter = run(sampler, Scripted({0: FAST_K}), canvas(0, 4))
    assert out.partition(0) == [[1], [4], [3], [2]] and counter.nfe.item() == 4


def read(network: Scripted, ident: int, step: int, position: int) -> float:
    """The confidence the sampler reads (float64 softmax, the mask ruled out) at answer `position`, step `step`."""
    probe = Scripted({ident: network.scripts[ident][step:]})
    logits = probe(canvas(ident, len(network.scripts[ident][0]))).double()
    logits[..., M] = float("-inf")
    return float(logits.softmax(-1)[0, position + 1].max())


def test_thresholds_are_inclusive() -> None:
    """In FIRST, step 3's guess reads offset 5 at 0.35, and 2, 3 are above tau_high at 0.95 and 0.92."""
    net = Scripted({0: FIRST})
    at = read(net, 0, 2, 5)
    out, _counter = run(SlowFastSampler(explore_steps=3, min_confidence=at, high_confidence=0.9), Scripted({0: FIRST}),
                        canvas(0, 8))
    assert out.partition(0) == [[1], [2], [3, 4], [6], [5], [7, 8]]  # guess 6, as before
    out, _counter = run(SlowFastSampler(explore_steps=3, min_confidence=math.nextafter(at, 1.0), high_confidence=0.9),
                        Scripted({0: FIRST}), canvas(0, 8))
    # guesses 2, 4 (unstable), then 5 (4 at 0.5; window (4, 5) stable): span [0, 5), the fast step reveals 4
    assert out.partition(0)[3] == [5]
    high = read(net, 0, 2, 3)
    out, _counter = run(SlowFastSampler(explore_steps=3, min_confidence=0.3, high_confidence=high),
                        Scripted({0: FIRST}), canvas(0, 8))
    assert out.partition(0)[2] == [3, 4]
    out, _counter = run(SlowFastSampler(explore_steps=3, min_confidence=0.3, high_confidence=high + 1e-9),
                        Scripted({0: FIRST}), canvas(0, 8))
    assert out.partition(0)[2] == [3]  # only 2 is left above tau_high: the best one alone


def test_span_cache_cuts_the_fast_forwards_after_the_first_at_the_span_end() -> None:
    net = Scripted({0: FIRST})
    out, counter = run(SlowFastSampler(explore_steps=3, min_confidence=0.3, high_confidence=0.9, span_cache=True),
                       net, canvas(0, 8))
    assert out.partition(0) == [[1], [2], [3, 4], [6], [5], [7, 8]] and counter.nfe.item() == 6
    # slow, slow, slow, the first fast forward whole, the second up to the span's last position (6), slow
    assert [tokens.shape[1] for tokens, _ in net.seen] == [9, 9, 9, 9, 7, 9]
    assert counter.tokens.item() == 5 * 9 + 7
    assert net.seen[4][1].flatten().tolist() == [True] * 7  # the one row needs the whole width: nothing hidden


def test_blocks_restart_the_cycle_and_offsets_count_the_blanks() -> None:
    """Blocks of 3 blanks; givens between the blanks are not offsets. Block 0: positions 1, 3, 4; block 1: 5, 7."""
    tokens = torch.tensor([[0, M, 2, M, M, M, 1, M]])
    assert block_offsets(tokens == M, 3).tolist() == [[-1, 0, -1, 1, 2, 0, -1, 1]]
    assert block_offsets(tokens == M, None).tolist() == [[-1, 0, -1, 1, 2, 3, -1, 4]]
    script = [
        [0.5, 0.99, 0.3, 0.4, 0.99, 0.3, 0.99],  # canvas positions 1..7; block 0: guess 3 (4 at 0.4); reveals 1
        [_, _, 0.95, 0.92, 0.99, _, 0.99],  # block 0: 3 and 4 above tau_high, revealed (not 5, 7: next block)
        [_, _, _, _, 0.4, _, 0.6],  # block 1 (5, 7): cycle at 0, slow: 7
        [_, _, _, _, 0.4, _, _],
    ]
    out, counter = run(SlowFastSampler(explore_steps=2, min_confidence=0.35, high_confidence=0.9, block_length=3),
                       Scripted({0: script}), tokens)
    assert out.partition(0) == [[1], [3, 4], [7], [5]] and counter.nfe.item() == 4
    assert out.tokens[0, [0, 2, 6]].tolist() == [0, 2, 1] and (out.reveal_step[0, [0, 2, 6]] == -1).all()


# -- batching, the reference code, stop conditions, padding, temperature --------------------------------------


def test_a_batch_of_scripted_rows_gives_each_row_its_single_row_result() -> None:
    scripts = {0: FIRST, 1: CODE_OR_PAPER + [[_] * 6] * 4, 2: [[0.99] * 6], 3: [[0.2, 0.3, 0.4, 0.5, 0.6, 0.7]]}
    batch = torch.cat([torch.cat([canvas(i, 6), torch.full((1, 2), i)], 1) if i else canvas(0, 8)
                       for i in range(4)])
    for sampler in (FIRST_SAMPLER, SlowFastSampler(explore_steps=2, min_confidence=0.3, high_confidence=0.9,
                                                   span_cache=True, block_length=4)):
        batched, counter = run(sampler, Scripted(scripts), batch)
        for row in range(4):
            single, single_counter = run(sampler, Scripted(scripts), batch[row : row + 1])
            assert torch.equal(single.tokens[0], batched.tokens[row])
            assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
            assert single_counter.nfe.item() == counter.nfe[row].item() == batched.steps[row].item()
        assert len(set(counter.nfe.tolist())) > 1  # rows progress independently


V, MASK, L = 7, 6, 12
real_network = partial(random_transformer, V, L, head_scale=40.0)
prompts = partial(masked_rows, length=L, mask_id=MASK)


@pytest.mark.parametrize("sampler", [
    SlowFastSampler(), SlowFastSampler(min_confidence=0.3, high_confidence=0.6, explore_steps=3),
    SlowFastSampler(explore_steps=2, window=3, stable_variance=4.0, block_length=4),
    SlowFastSampler(explore_steps=3, explore_until_stable=True, slow_k=2, top_p=0.8),
    SlowFastSampler(explore_steps=2, high_confidence=0.7, span_cache=True),
    SlowFastSampler(explore_steps=2, high_confidence=0.7, span_cache=True, block_length=3, fast_k=2),
], ids=repr)
def test_batched_equals_one_row_at_a_time_and_every_forward_reveals(sampler: SlowFastSampler) -> None:
    network, batch = real_network(), prompts()
    batched, counter = run(sampler, network, batch, mask=MASK)
    assert (batched.tokens != MASK).all() and torch.equal(batched.tokens[batch != MASK], batch[batch != MASK])
    assert (batched.reveal_step[batch != MASK] == -1).all()
    for row in range(len(batch)):
        single, single_counter = run(sampler, network, batch[row : row + 1], mask=MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert single_counter.nfe.item() == counter.nfe[row].item() == batched.steps[row].item()
        assert single_counter.tokens.item() <= counter.tokens[row].item()  # a cut single row runs only its width
    assert all(len(step) >= 1 for row in range(len(batch)) for step in batched.partition(row))
    assert (counter.nfe <= (batch == MASK).sum(1)).all()


def reference(network: torch.nn.Module, prompt: list[int], gen: int, sampler: SlowFastSampler) -> tuple:
    """One row, as `generate_slow_fast_sampling` loops (prompt, then `gen` masks in blocks; T = 0; confidences in
    float64 without the mask token, ties to the lower position, as mdmkit). Its slow phase also spends forwards on
    a block with no mask left: those are counted in `idle`, not run. Returns tokens, NFE, idle and what happened."""
    x, start_gen, block = list(prompt) + [MASK] * gen, len(prompt), sampler.block_length or gen
    nfe = idle = 0
    seen = {"fast": 0, "stable": 0, "unstable": 0, "together": 0}

    def predict(width: int) -> tuple[list[int], list[float]]:
        logits = network(torch.tensor([x[:width]])).double()[0]
        logits[:, MASK] = float("-inf")
        confidence, token = logits.softmax(-1).max(-1)
        return token.tolist(), confidence.tolist()

    def reveal(span: range, token: list[int], confidence: list[float], least: int) -> None:
        masked = [i for i in span if x[i] == MASK]
        high = [i for i in masked if confidence[i] >= sampler.high_confidence]
        ranked = sorted(masked, key=lambda i: (-confidence[i], i))
        for i in ranked[: max(len(high), least)]:
            x[i] = token[i]
        seen["together"] += len(high) > 1

    for first in range(start_gen, start_gen + gen, block):
        last = 0
        while MASK in x[first : first + block]:
            history: list[int] = []
            end, determined = block, False
            for k in range(sampler.explore_steps):
                if MASK not in x[first : first + block]:
                    idle += 1
                    continue
                token, confidence = predict(len(x))
                nfe += 1
                if not determined:
                    reach = [i for i in range(first + last, first + block)
                             if x[i] == MASK and confidence[i] >= sampler.min_confidence]
                    guess = min(max(1, reach[-1] - first + 1 if reach else last + 1), block)
                    history = (history + [guess])[-sampler.window :]
                    if len(history) >= sampler.window and statistics.pvariance(history) < sampler.stable_variance:
                        end, determined = guess, True
                        seen["stable"] += 1
                    else:
                        end = max(1, min(int(statistics.mean(history)), block))
                        determined = k == sampler.explore_steps - 1
                        seen["unstable"] += determined
                    if determined and sampler.explore_until_stable:
                        reveal(range(first + last, first + block), token, confidence, sampler.slow_k)
                        break
                reveal(range(first + last, first + block), token, confidence, sampler.slow_k)
            calls = 0
            while MASK in x[first + last : first + end]:
                cut = sampler.span_cache and calls > 0
                token, confidence = predict(first + end if cut else len(x))
                nfe, calls = nfe + 1, calls + 1
                seen["fast"] += 1
                reveal(range(first + last, first + end), token, confidence, sampler.fast_k)
            last = end
    return x, nfe, idle, seen


REFERENCE_SAMPLERS = [
    SlowFastSampler(), SlowFastSampler(min_confidence=0.3, high_confidence=0.9, explore_steps=6),
    SlowFastSampler(explore_steps=3, window=3, stable_variance=2.0, block_length=8),
    SlowFastSampler(explore_steps=2, high_confidence=0.6, span_cache=True, block_length=4),
    SlowFastSampler(explore_steps=4, explore_until_stable=True, high_confidence=0.7),
    SlowFastSampler(explore_steps=3, window=1, min_confidence=0.5, fast_k=2, slow_k=2, span_cache=True),
]


def test_the_sampler_follows_the_reference_loop_on_random_networks() -> None:
    """Contiguous answers (the code's layout), 16 masks after a random prompt, 8 networks x 6 settings."""
    width, gen = 20, 16
    total = {"fast": 0, "stable": 0, "unstable": 0, "together": 0}
    idle_seen = 0
    for seed in range(8):
        network = random_transformer(V, width, seed=seed, head_scale=float(10 + 10 * seed))
        prompt = torch.randint(0, MASK, (width - gen,), generator=torch.Generator().manual_seed(seed)).tolist()
        row = torch.tensor([prompt + [MASK] * gen])
        for sampler in REFERENCE_SAMPLERS:
            tokens, nfe, idle, seen = reference(network, prompt, gen, sampler)
            out, counter = run(sampler, network, row, mask=MASK)
            assert out.tokens[0].tolist() == tokens, (seed, sampler)
            assert counter.nfe.item() == nfe, (seed, sampler)
            idle_seen += idle
            for key in total:
                total[key] += seen[key]
    assert all(count > 0 for count in total.values()), total  # every branch of the rule was taken
    assert idle_seen > 0  # and the code's idle forwards, skipped here, happened


def test_a_stop_token_ends_the_row_once_everything_before_it_is_revealed() -> None:
    """FIRST reveals positions 3 and 4 at step 3, position 3 holding token 3 with 1 and 2 revealed before it."""
    stop = StopCondition.of([3])
    out, counter = run(FIRST_SAMPLER, Scripted({0: FIRST}), canvas(0, 8), stop=stop)
    assert out.tokens[0, :5].tolist() == [0, 1, 2, 3, 4] and (out.tokens[0, 5:] == M).all()
    assert counter.nfe.tolist() == counter.nfe_at_stop.tolist() == [3]
    out, counter = run(replace_field(FIRST_SAMPLER, stop_early=False), Scripted({0: FIRST}), canvas(0, 8), stop=stop)
    assert (out.tokens != M).all() and counter.nfe.tolist() == [6] and counter.nfe_at_stop.tolist() == [3]


def replace_field(sampler: SlowFastSampler, **fields: Any) -> SlowFastSampler:
    return SlowFastSampler(**{**sampler.to_dict(), **fields})


def test_padding_is_invisible_to_the_network() -> None:
    network, prompt = real_network(), prompts(1)
    prompt[0, :3] = 0
    keep = torch.ones_like(prompt, dtype=torch.bool)
    keep[0, :3] = False
    other = prompt.clone()
    other[0, :3] = 4
    sampler = SlowFastSampler(explore_steps=2, high_confidence=0.7, span_cache=True)
    a, _counter = run(sampler, network, prompt, mask=MASK, attention_mask=keep)
    b, _counter = run(sampler, network, other, mask=MASK, attention_mask=keep)
    assert torch.equal(a.tokens[0, 3:], b.tokens[0, 3:])
    both, _counter = run(sampler, network, torch.cat([prompt, prompts(2)[1:]]), mask=MASK,
                         attention_mask=torch.cat([keep, torch.ones(1, L, dtype=torch.bool)]))
    assert torch.equal(both.tokens[0], a.tokens[0])


def test_temperature_draws_follow_the_distribution_and_a_seed_fixes_them() -> None:
    x = torch.zeros(4000, 2, dtype=torch.long)
    x[:, 1] = M  # one masked position: one draw from its distribution (0.8 on token 1)
    out, _counter = run(SlowFastSampler(temperature=1.0), Scripted({0: [[0.8]]}), x,
                        generator=torch.Generator().manual_seed(0))
    assert abs(float((out.tokens[:, 1] == 1).float().mean()) - 0.8) < 0.03 and (out.tokens != M).all()
    network, batch = real_network(), prompts()
    draw = lambda seed: run(SlowFastSampler(temperature=1.0, block_length=4), network, batch, mask=MASK,
                            generator=torch.Generator().manual_seed(seed))[0].tokens
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))


# -- configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"min_confidence": 1.5}, r"min_confidence=1.5 must lie in \[0, 1\]"),
    ({"high_confidence": -0.1}, r"high_confidence=-0.1 must lie in \[0, 1\]"),
    ({"explore_steps": 0}, "explore_steps=0 must be >= 1"),
    ({"window": 0}, "window=0 must be >= 1"),
    ({"stable_variance": -1.0}, "stable_variance=-1.0 must be >= 0"),
    ({"slow_k": 0}, "slow_k=0 must be >= 1"),
    ({"fast_k": 0}, "fast_k=0 must be >= 1"),
    ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
    ({"top_p": 0.0}, r"top_p=0.0 must lie in \(0, 1\]"),
    ({"block_length": 0}, "block_length=0 must be >= 1 or null"),
    ({"cache": "dual"}, "cache=dual is not supported by SlowFast"),
    ({"explore_steps": 2.5}, "explore_steps"),
    ({"span_cache": "yes"}, "span_cache"),
])
def test_bad_settings_are_one_config_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        SlowFastSampler(**fields)
    assert "\n" not in str(error.value)


def test_the_option_builds_the_defaults_names_its_family_and_runs_end_to_end() -> None:
    """The defaults are the paper's (Section 4.2): tau_min 0.1, tau_high 0.85, K 8, W 2, variance 1."""
    sampler = build(option("sampler", "slowfast"), "sampler")
    assert sampler == SlowFastSampler()
    assert (sampler.min_confidence, sampler.high_confidence, sampler.explore_steps, sampler.window,
            sampler.stable_variance) == (0.1, 0.85, 8, 2, 1.0)
    config = {"_target_": "mdmkit.samplers.SlowFastSampler", **option("sampler", "slowfast")}
    assert derive_family({"sampler": config}) == "slowfast"
    small = build({**config, "block_length": 4, "span_cache": True}, "sampler")
    network, batch = real_network(), prompts()
    out, counter = run(small, network, batch, mask=MASK)
    assert (out.tokens != MASK).all() and torch.equal(out.tokens[batch != MASK], batch[batch != MASK])
    assert torch.equal(counter.nfe, out.steps) and (counter.nfe <= (batch == MASK).sum(1)).all()
    assert (counter.nfe < (batch == MASK).sum(1)).any()  # some step revealed more than one position

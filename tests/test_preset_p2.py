"""`p2_listing` against the paper's own PyTorch listing (Peng et al., Appendix E, Listing 1), and where it parts
from `p2` (Algorithm 1). `listing_reference` re-states the listing for one row, apart from the samplers."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from fakes import FixedLogits, random_transformer

from mdmkit.core.config import build, option
from mdmkit.samplers import ForwardCounter, P2ListingSampler, P2Sampler

V, MASK, L = 6, 5, 10
KAPPA = {"linear": lambda t: t, "cosine": lambda t: 1 - math.cos(math.pi * t / 2), "sqrt": math.sqrt}

pytestmark = pytest.mark.usefixtures("one_thread")
network = partial(random_transformer, V, L, head_scale=40.0)


def prompts(rows: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    out = torch.randint(0, MASK, (rows, L), generator=generator)
    for row in range(rows):
        out[row, torch.randperm(L, generator=generator)[: 3 + row % (L - 2)]] = MASK
    return out


def log_probs(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One row's float64 logits with the mask token ruled out (mdmkit never proposes it)."""
    logits = net(x[None])[0].double()
    logits[:, MASK] = -math.inf
    return logits


def listing_reference(net, prompt, steps: int, eta: float, kappa: str, temperature: float = 0.0,
                      score_type: str = "confidence", planner=None, generator=None) -> torch.Tensor:
    """Listing 1 for one row: propose x0 (Gumbel-max on logits / T, scored by the perturbed log-softmax), let the
    planner re-score revealed positions, scale those by eta, then mask what scores strictly below the
    count-th lowest score, count = float32(n_free) * (1 - kappa(step / steps)) truncated."""
    x = prompt.clone()
    fixed = x != MASK
    free = torch.tensor([float((~fixed).sum())], dtype=torch.float32)
    for step in range(1, steps + 1):
        t = step * (1.0 / steps)
        logits = log_probs(net, x)
        was_masked = x == MASK
        revealed = ~was_masked & ~fixed
        if temperature > 0:
            u = torch.rand((1, *logits.shape), generator=generator, dtype=torch.float64)[0]
            logits = logits / temperature - torch.log(-torch.log(u + 1e-8) + 1e-8)
        logp, x0 = logits.log_softmax(-1).max(-1)
        if planner is not None and revealed.any():
            judged = log_probs(planner, x0).log_softmax(-1).gather(-1, x0[:, None])[:, 0]
            logp = torch.where(revealed, judged, logp)
        if score_type == "random":
            logp = torch.rand((1, L), generator=generator, dtype=torch.float64)[0].log()
        score = torch.where(revealed, logp * eta if eta > 0 else torch.zeros_like(logp), logp)
        score[fixed] = math.inf
        count = int((free * (1 - KAPPA[kappa](t))).long())
        cut = score.sort().values[count] if count < L else math.inf
        remask = (score < cut) & ~fixed
        x[remask] = MASK
        x[was_masked & ~remask] = x0[was_masked & ~remask]
    return x


@pytest.mark.parametrize("kappa", ["linear", "cosine", "sqrt"])
@pytest.mark.parametrize("eta", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("steps", [3, 7, 12])
def test_greedy_p2_listing_matches_the_listing(kappa: str, eta: float, steps: int) -> None:
    net, x = network(), prompts(6)
    out = P2ListingSampler(steps=steps, eta=eta, kappa=kappa).sample(ForwardCounter(net, 6), x, MASK)
    for row in range(6):
        assert torch.equal(out.tokens[row], listing_reference(net, x[row], steps, eta, kappa))


@pytest.mark.parametrize("score", ["confidence", "random"])
def test_tempered_p2_listing_matches_the_listing_draw_for_draw(score: str) -> None:
    net, planner = network(), network(2, d_model=16, n_layers=1)
    for row, prompt in enumerate(prompts(4)):
        use_planner = planner if score == "confidence" else None
        sampler = P2ListingSampler(steps=5, eta=1.5, temperature=1.0, score=score, planner=use_planner)
        out = sampler.sample(ForwardCounter(net, 1), prompt[None], MASK, torch.Generator().manual_seed(row))
        expected = listing_reference(net, prompt, 5, 1.5, "linear", temperature=1.0, score_type=score,
                                     planner=use_planner, generator=torch.Generator().manual_seed(row))
        assert torch.equal(out.tokens[0], expected)


def test_a_planner_reads_the_raw_proposal() -> None:
    net, planner = network(), network(3, d_model=16, n_layers=1)
    x = prompts(6)
    out = P2ListingSampler(steps=6, eta=2.0, planner=planner).sample(ForwardCounter(net, 6), x, MASK)
    for row in range(6):
        assert torch.equal(out.tokens[row], listing_reference(net, x[row], 6, 2.0, "linear", planner=planner))


def test_tied_scores_are_all_revealed_where_algorithm_1_keeps_the_count() -> None:
    # four masked positions, each certain (log p = 0.0 exactly): a four-way tie at every cut-off
    logits = torch.full((4, V), -1000.0)
    logits[torch.arange(4), torch.arange(4)] = 0.0
    x = torch.full((1, 4), MASK)
    listing = P2ListingSampler(steps=4).sample(ForwardCounter(FixedLogits(logits), 1), x, MASK)
    paper = P2Sampler(steps=4).sample(ForwardCounter(FixedLogits(logits), 1), x, MASK)
    assert listing.reveal_step.tolist() == [[0, 0, 0, 0]]  # nothing scores strictly below the tie: all revealed
    # floor(4 (1 - t)) = 3, 2, 1, 0 stay masked, the tie going to the lower positions: one reveal per step
    assert paper.reveal_step.tolist() == [[3, 2, 1, 0]]
    assert listing.tokens.tolist() == paper.tokens.tolist() == [[0, 1, 2, 3]]


def test_the_listing_count_is_a_truncated_float32_product() -> None:
    # 108 free positions, step 5 of 12: 108 * 7/12 = 63 exactly, 62.99999... in float32
    free = torch.tensor([108])
    assert P2ListingSampler(steps=12).masked_count(free, 4).item() == 62
    assert P2Sampler(steps=12).masked_count(free, 4).item() == 63
    for steps in (1, 4, 16):  # the last step masks nothing in both
        assert P2ListingSampler(steps=steps, kappa="cosine").masked_count(free, steps - 1).item() == 0
    # the same in a run: the input of the 6th forward holds 62 masks under the listing, 63 under Algorithm 1
    logits = torch.randn(108, V, generator=torch.Generator().manual_seed(0)) * 3
    for sampler, masks in ((P2ListingSampler(steps=12), 62), (P2Sampler(steps=12), 63)):
        net = FixedLogits(logits)
        sampler.sample(ForwardCounter(net, 1), torch.full((1, 108), MASK), MASK)
        assert int((net.seen[5] == MASK).sum()) == masks


def test_batched_equals_one_row_at_a_time() -> None:
    net, planner = network(), network(2, d_model=16, n_layers=1)
    x = prompts(6)
    sampler = P2ListingSampler(steps=5, eta=2.0, kappa="cosine", planner=planner)
    counter = ForwardCounter(net, 6)
    batched = sampler.sample(counter, x, MASK)
    for row in range(6):
        single_counter = ForwardCounter(net, 1)
        single = sampler.sample(single_counter, x[row : row + 1], MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert single_counter.cost.tolist() == pytest.approx([counter.cost[row].item()])
    assert (batched.tokens != MASK).all()


def test_the_preset_states_the_class_defaults() -> None:
    assert build(option("sampler", "p2_listing"), "sampler") == P2ListingSampler()
    assert build(option("sampler", "p2"), "sampler") == P2Sampler()

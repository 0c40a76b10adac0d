"""WINO against hand-worked cases: a toy network whose distributions are set by hand and depend on what each query
may see, so the drafts, the shadow-block verification and the positions re-masked on the next step are known
exactly, with the exact NFE; the shadow block's inputs; batching, stop conditions, padding and bad settings."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from fakes import FixedConfidence, masked_rows, random_transformer

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build, option
from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.models.denoiser import KV_CACHE, require_capabilities
from mdmkit.samplers import ForwardCounter, WinoSampler

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, M = 6, 5  # tokens 0..4, the mask is 5


class Contextual(torch.nn.Module):
    """A query at position p predicts `target[p]` with probability `ready[p]` once every position in `needs[p]`
    holds a revealed token it may see, else `wrong[p]` = target[p] + 1 (mod 5) with probability `waiting[p]`; a
    query that sees a revealed token at its own position predicts that token with probability 0.99 (so a
    verification that could see the token it judges would always pass). The rest of the mass is spread evenly
    over the other real tokens, none on the mask.

    It reads `positions` and a full `attn_mask` as the `kv_cache` capability promises, and records every call's
    (tokens, positions, attn_mask) in `seen`.
    """

    capabilities = frozenset({KV_CACHE})

    def __init__(self, target: list[int], ready: list[float], needs: dict[int, list[int]] | None = None,
                 waiting: dict[int, float] | None = None) -> None:
        super().__init__()
        length = len(target)
        self.target = torch.tensor(target)
        self.wrong = (self.target + 1) % M
        self.ready = torch.tensor(ready, dtype=torch.float64)
        self.waiting = self.ready.clone()
        for position, probability in (waiting or {}).items():
            self.waiting[position] = probability
        self.needs = torch.zeros(length, length, dtype=torch.bool)
        for position, others in (needs or {}).items():
            self.needs[position, others] = True
        self.seen: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
                **_: Any) -> torch.Tensor:
        self.seen.append((tokens.clone(), None if positions is None else positions.clone(),
                          None if attn_mask is None else attn_mask.clone()))
        batch, width = tokens.shape
        where = torch.arange(width).expand(batch, -1) if positions is None else positions
        sees = torch.ones(batch, width, width, dtype=torch.bool) if attn_mask is None else \
            attn_mask[:, 0].expand(batch, width, width).bool()
        shown = sees & (tokens != M)[:, None, :]  # [B, query, key]: revealed keys the query may see
        at = torch.nn.functional.one_hot(where, len(self.target)).double()  # [B, key, position]
        known = (shown.double() @ at) > 0  # [B, query, position]
        ready = ~(self.needs[where] & ~known).any(-1)
        own = shown & (where[:, None, :] == where[:, :, None])
        has_own = own.any(-1)
        own_token = torch.where(own, tokens[:, None, :], -1).max(-1).values
        token = torch.where(has_own, own_token, torch.where(ready, self.target[where], self.wrong[where]))
        probability = torch.where(has_own, 0.99, torch.where(ready, self.ready[where], self.waiting[where]))
        probs = ((1 - probability) / (VOCAB - 2))[..., None].repeat(1, 1, VOCAB)
        probs.scatter_(-1, token[..., None], probability[..., None])
        probs[..., M] = 0.0
        return probs.clamp_min(1e-30).log()


def run(sampler: WinoSampler, network: torch.nn.Module, tokens: torch.Tensor, mask: int = M, **kwargs):
    counter = ForwardCounter(network, len(tokens))
    return sampler.sample(counter, tokens, mask, **kwargs), counter


def canvases(network: Contextual, length: int) -> list[list[int]]:
    """The canvas part of every forward's input (single-row runs)."""
    return [tokens[0, :length].tolist() for tokens, _, _ in network.seen]


# -- hand-worked cases ---------------------------------------------------------------------------------------


def first_case() -> Contextual:
    """Targets 1 2 3 4 0 2; position 2 needs 1, 3 needs 0, 4 needs 3 and 5 needs 1."""
    return Contextual([1, 2, 3, 4, 0, 2], ready=[0.95, 0.92, 0.95, 0.93, 0.9, 0.91],
                      needs={2: [1], 3: [0], 4: [3], 5: [1]}, waiting={2: 0.7, 3: 0.4, 4: 0.65, 5: 0.3})


def test_drafts_are_verified_on_the_next_step_and_the_failures_re_masked() -> None:
    """Targets 1 2 3 4 0 2; 2 needs 1, 3 needs 0, 4 needs 3, 5 needs 1; tau_in 0.6, tau_out 0.9.

    Step 1 drafts 0 (0.95), 1 (0.92), 2 (its wrong token 4 at 0.7) and 4 (its wrong token 1 at 0.65); 3 (0.4) and 5
    (0.3) wait. Step 2 drafts 3 (0.93) and 5 (0.9), two drafts, so it verifies 0 1 2 4 through the shadow: 0 and 1
    hold (0.95, 0.92), 2's shadow now sees 1 and gives its token 4 only 0.0125, 4's shadow still misses 3 and gives
    1 0.65: both re-masked (2 failures < 4 drafted before). Step 3 drafts 2 and 4, right this time, and verifies
    0 1 3 5 (0.95 0.92 0.93 0.91): the block is full after 3 forwards.
    """
    net = first_case()
    out, counter = run(WinoSampler(), net, torch.full((1, 6), M))
    assert out.tokens.tolist() == [[1, 2, 3, 4, 0, 2]]
    assert canvases(net, 6) == [[M] * 6, [1, 2, 4, M, 1, M], [1, 2, M, 4, M, 2]]
    assert counter.nfe.tolist() == out.steps.tolist() == [3]
    assert out.partition(0) == [[0, 1], [3, 5], [2, 4]]  # the step that revealed each token for good


def test_one_draft_means_no_verification_and_the_bound_keeps_one_less_than_the_last_drafts() -> None:
    """Step 1 drafts 0 (0.8) and 1 (0.7). Step 2 drafts 2 and 3 (each needs one of them) and verifies: both
    fail (0.8, 0.7 < 0.9), as many as step 1 drafted, so only 2 - 1 = 1 is re-masked, the lowest (1). Step 3
    drafts 1 again, alone (4 still misses it): no verification although 1 would fail again; step 4 reveals 4,
    below tau_in (0.55), as the best of one."""
    net = Contextual([1, 2, 3, 4, 0], ready=[0.8, 0.7, 0.95, 0.95, 0.55], needs={2: [0], 3: [1], 4: [0, 1]},
                     waiting={2: 0.1, 3: 0.1, 4: 0.1})
    out, counter = run(WinoSampler(), net, torch.full((1, 5), M))
    assert canvases(net, 5) == [[M] * 5, [1, 2, M, M, M], [1, M, 3, 4, M], [1, 2, 3, 4, M]]
    assert out.tokens.tolist() == [[1, 2, 3, 4, 0]] and counter.nfe.item() == 4
    assert out.partition(0) == [[0], [2, 3], [1], [4]]


def exact(network: Contextual, tokens: list[int], position: int, token: int) -> float:
    """The probability the sampler reads (float64 softmax, the mask ruled out) for `token` at `position`."""
    logits = network(torch.tensor([tokens])).double()
    logits[..., M] = float("-inf")
    network.seen.clear()
    return float(logits.softmax(-1)[0, position, token])


def test_drafting_needs_more_than_tau_in_and_re_masking_less_than_tau_out() -> None:
    net = Contextual([1, 2], ready=[0.8, 0.7])
    at = exact(net, [M, M], 1, 2)  # 0.7, as the sampler computes it
    assert run(WinoSampler(tau_in=at), net, torch.full((1, 2), M))[0].partition(0) == [[0], [1]]
    assert run(WinoSampler(tau_in=at - 1e-9), net, torch.full((1, 2), M))[0].partition(0) == [[0, 1]]
    # the first hand-worked case: at step 3, position 5 is verified at 0.91 exactly
    net = first_case()
    held = exact(net, [1, 2, 3, 4, 0, M], 5, 2)
    out, counter = run(WinoSampler(tau_out=held), net, torch.full((1, 6), M))
    assert counter.nfe.item() == 3 and out.partition(0) == [[0, 1], [3, 5], [2, 4]]  # kept: not below tau_out
    out, counter = run(WinoSampler(tau_out=held + 1e-9), net, torch.full((1, 6), M))
    assert counter.nfe.item() == 4 and out.partition(0) == [[0, 1], [3], [2, 4], [5]]  # re-masked, drafted again


def test_the_draft_cap_keeps_the_most_confident() -> None:
    """Ten positions above tau_in, cap clamp(floor(0.7 * 10), 5, 20) = 7: the 7 most confident go first."""
    conf = [0.91, 0.99, 0.92, 0.98, 0.93, 0.97, 0.94, 0.96, 0.95, 0.90]
    net = Contextual([i % 5 for i in range(10)], ready=conf)
    out, counter = run(WinoSampler(), net, torch.full((1, 10), M))
    assert out.partition(0) == [[1, 3, 4, 5, 6, 7, 8], [0, 2, 9]] and counter.nfe.item() == 2
    out, counter = run(WinoSampler(draft_cap=2, draft_floor=1), Contextual([i % 5 for i in range(10)], conf),
                       torch.full((1, 10), M))
    # caps min(max(floor(0.7 m), 1), 2) for m = 10 8 6 4 2 1: 2 2 2 2 1 1
    assert out.partition(0) == [[1, 3], [5, 7], [6, 8], [2, 4], [0], [9]] and counter.nfe.item() == 6


def test_draft_limit_by_hand() -> None:
    masked = torch.tensor([1, 5, 7, 8, 10, 28, 29, 30, 100])
    # floor(0.7 m): 0 3 4 5 7 19 20 21 70 -> at least 5 -> at most 20
    assert WinoSampler().draft_limit(masked).tolist() == [5, 5, 5, 5, 7, 19, 20, 20, 20]
    assert WinoSampler(draft_cap=None).draft_limit(masked).tolist() == [5, 5, 5, 5, 7, 19, 20, 21, 70]
    assert WinoSampler(draft_share=1.0, draft_floor=1, draft_cap=None).draft_limit(masked).tolist() == \
        masked.tolist()


def test_the_shadow_block_hides_each_verified_position_from_its_own_slot() -> None:
    """Canvas 0 1 _ 3 _ (2 given) in blocks of 2 answer positions: the first block is positions 0 and 1.

    The forward runs the canvas and two mask slots at position ids 0 and 1; the canvas sees only the canvas,
    slot j sees the canvas but its own position, and both slots.
    """
    net = Contextual([1, 2, 3, 4, 0], ready=[0.95] * 5)
    run(WinoSampler(block_length=2), net, torch.tensor([[M, M, 3, M, M]]))
    tokens, positions, attn_mask = net.seen[0]
    assert tokens.tolist() == [[M, M, 3, M, M, M, M]] and positions.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    canvas, one = [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]
    assert attn_mask.int().tolist() == [[[canvas] * 5 + [[0] + one[1:], [1, 0] + one[2:]]]]
    assert [t[0, :5].tolist() for t, _, _ in net.seen] == [[M, M, 3, M, M], [1, 2, 3, M, M]]
    assert [p[0, 5:].tolist() for _, p, _ in net.seen] == [[0, 1], [3, 4]]  # the second block: positions 3, 4


def test_rows_of_a_batch_pad_the_shadow_with_slots_that_no_one_sees() -> None:
    net = Contextual([1, 2, 3, 4, 0], ready=[0.95] * 5)
    run(WinoSampler(block_length=2), net, torch.tensor([[M, M, 3, M, M], [1, 2, 3, 4, M]]))
    tokens, positions, attn_mask = net.seen[0]
    assert tokens[1].tolist() == [1, 2, 3, 4, M, M, M] and positions[1, 5:].tolist() == [4, 4]  # slot 1: padding
    assert attn_mask[1, 0, :, 6].int().tolist() == [0] * 6 + [1]  # only the padding slot sees itself
    assert attn_mask[1, 0, 6].int().tolist() == [0] * 6 + [1]
    assert attn_mask[1, 0, 5].int().tolist() == [1, 1, 1, 1, 0, 1, 0]


# -- batching, the NFE bound, stop conditions, padding, temperature ------------------------------------------

V, MASK, L = 7, 6, 12
real_network = partial(random_transformer, V, L, head_scale=40.0)
prompts = partial(masked_rows, length=L, mask_id=MASK)


class Recording(torch.nn.Module):
    """A real network behind a recorder of its canvases (the first `length` columns of every input)."""

    def __init__(self, network: torch.nn.Module, length: int) -> None:
        super().__init__()
        self.network, self.length, self.seen = network, length, []
        self.capabilities = network.capabilities

    def forward(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.seen.append(tokens[:, : self.length].clone())
        return self.network(tokens, **kwargs)


@pytest.mark.parametrize("sampler", [
    WinoSampler(), WinoSampler(tau_in=0.5, tau_out=0.99), WinoSampler(tau_in=0.25),
    WinoSampler(tau_in=0.4, tau_out=0.95, block_length=4), WinoSampler(draft_floor=1, draft_cap=2, top_p=0.8),
], ids=repr)
def test_batched_equals_one_row_at_a_time_and_a_block_never_takes_more_steps_than_positions(sampler) -> None:
    network, batch = real_network(), prompts()
    batched, counter = run(sampler, network, batch, mask=MASK)
    assert (batched.tokens != MASK).all() and torch.equal(batched.tokens[batch != MASK], batch[batch != MASK])
    assert (batched.reveal_step[batch != MASK] == -1).all()
    for row in range(len(batch)):
        single, single_counter = run(sampler, network, batch[row : row + 1], mask=MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert single_counter.nfe.item() == counter.nfe[row].item() == batched.steps[row].item()
    assert (counter.nfe <= (batch == MASK).sum(1)).all()


def test_the_real_network_does_re_mask() -> None:
    """The batched comparisons above cover re-masking: on these rows some revealed tokens are masked again."""
    network, batch = real_network(), prompts()
    remasked = 0
    for row in range(len(batch)):
        recorder = Recording(network, L)
        run(WinoSampler(tau_in=0.5, tau_out=0.99), recorder, batch[row : row + 1], mask=MASK)
        remasked += sum(int(((a != MASK) & (b == MASK)).sum()) for a, b in zip(recorder.seen, recorder.seen[1:]))
    assert remasked > 0


def test_a_stop_token_settles_only_once_its_block_is_finished() -> None:
    """Block 0 is positions 0-2: step 1 drafts 0 and the stop token at 1, but 2 (0.5) is still masked and the
    drafts could be re-masked, so the row is settled after step 2, not 1."""
    stop = StopCondition.of([4])
    net = Contextual([1, 4, 3, 2, 2, 2], ready=[0.95, 0.95, 0.5, 0.95, 0.95, 0.95])
    out, counter = run(WinoSampler(block_length=3), net, torch.full((1, 6), M), stop=stop)
    assert out.tokens.tolist() == [[1, 4, 3, M, M, M]]
    assert counter.nfe.tolist() == counter.nfe_at_stop.tolist() == [2]
    net = Contextual([1, 4, 3, 2, 2, 2], ready=[0.95, 0.95, 0.5, 0.95, 0.95, 0.95])
    out, counter = run(WinoSampler(block_length=3, stop_early=False), net, torch.full((1, 6), M), stop=stop)
    assert out.tokens.tolist() == [[1, 4, 3, 2, 2, 2]]
    assert counter.nfe.tolist() == [3] and counter.nfe_at_stop.tolist() == [2]


def test_padding_is_invisible_to_the_network() -> None:
    network, prompt = real_network(), prompts(1)
    prompt[0, :3] = 0
    keep = torch.ones_like(prompt, dtype=torch.bool)
    keep[0, :3] = False
    other = prompt.clone()
    other[0, :3] = 4
    sampler = WinoSampler(tau_in=0.4, block_length=3)
    a, _ = run(sampler, network, prompt, mask=MASK, attention_mask=keep)
    b, _ = run(sampler, network, other, mask=MASK, attention_mask=keep)
    assert torch.equal(a.tokens[0, 3:], b.tokens[0, 3:])
    both, _ = run(sampler, network, torch.cat([prompt, prompts(2)[1:]]), mask=MASK,
                  attention_mask=torch.cat([keep, torch.ones(1, L, dtype=torch.bool)]))
    assert torch.equal(both.tokens[0], a.tokens[0])


def test_same_seed_same_sample_and_temperature_draws_follow_the_distribution() -> None:
    network, batch = real_network(), prompts()
    draw = lambda seed: run(WinoSampler(temperature=1.0), network, batch, mask=MASK,
                            generator=torch.Generator().manual_seed(seed))[0].tokens
    assert torch.equal(draw(0), draw(0)) and not torch.equal(draw(0), draw(1))
    x = torch.zeros(4000, 3, dtype=torch.long)
    x[:, 0] = M  # one masked position: one draw from its distribution (0.8 on its target 1)
    out, _ = run(WinoSampler(temperature=1.0), Contextual([1, 2, 3], ready=[0.8, 0.5, 0.5]), x,
                 generator=torch.Generator().manual_seed(0))
    assert abs(float((out.tokens[:, 0] == 1).float().mean()) - 0.8) < 0.03 and (out.tokens != M).all()


# -- what it needs, and configuration -------------------------------------------------------------------------


def test_a_network_without_positions_and_full_masks_is_refused_in_one_line() -> None:
    plain = FixedConfidence([0.9, 0.8, 0.7])
    with pytest.raises(CapabilityError, match="kv_cache") as error:
        run(WinoSampler(), plain, torch.full((1, 3), 5), mask=5)
    assert "\n" not in str(error.value)
    with pytest.raises(CapabilityError, match="WinoSampler needs kv_cache"):
        require_capabilities(WinoSampler(), plain)


@pytest.mark.parametrize(("fields", "message"), [
    ({"tau_in": 1.5}, r"tau_in=1.5 must lie in \[0, 1\]"),
    ({"tau_out": -0.1}, r"tau_out=-0.1 must lie in \[0, 1\]"),
    ({"draft_share": 0.0}, r"draft_share=0.0 must lie in \(0, 1\]"),
    ({"draft_floor": 0}, "draft_floor=0 must be >= 1"),
    ({"draft_cap": 0}, "draft_cap=0 must be >= 1 or null"),
    ({"draft_floor": 30, "draft_cap": 5}, "draft_cap=5 is below draft_floor=30"),
    ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
    ({"top_p": 1.5}, r"top_p=1.5 must lie in \(0, 1\]"),
    ({"block_length": 0}, "block_length=0 must be >= 1 or null"),
    ({"cache": "dual"}, "cache=dual is not supported by WINO"),
    ({"draft_cap": 2.5}, "draft_cap"),
])
def test_bad_settings_are_one_config_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        WinoSampler(**fields)
    assert "\n" not in str(error.value)


def test_the_option_builds_the_defaults_and_names_its_family() -> None:
    assert build(option("sampler", "wino"), "sampler") == WinoSampler()
    sampler = {"_target_": "mdmkit.samplers.WinoSampler", **option("sampler", "wino")}
    assert derive_family({"sampler": sampler}) == "wino"

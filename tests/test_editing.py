"""Token editing (EditingSampler, core/editing.py) on toy networks whose distributions are scripted per canvas state,
so every edit, post step and forward is worked out by hand: an edit happens exactly when the model prefers another
token above the threshold (strictly), post steps end at the first that changes nothing or at the limit, each is
counted in NFE, earlier blocks are never edited, a stop waits for the block to close, and a batch gives each row
its own run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mdmkit import api
from mdmkit.core.config import build
from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.samplers import (
    BlockDiffusionSampler,
    EBSampler,
    EditingSampler,
    FactorSampler,
    ForwardCounter,
    KlassSampler,
    Llada21Sampler,
    M2TSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.window_walk import window_mask
from mdmkit.samplers.rules.llada2_1 import TransferThreshold

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, M = 5, 4  # tokens 0-3, the mask 4
Script = Callable[[tuple[int, ...]], dict[int, tuple[int, float]]]


class Scripted(torch.nn.Module):
    """Logits from a script: for each canvas state, {position: (token, p)}; the rest of a position's mass is spread
    evenly over the other real tokens, the mask never (so every softmax reads the same)."""

    def __init__(self, script: Script) -> None:
        super().__init__()
        self.script = script
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.states: list[tuple[int, ...]] = []

    def forward(self, tokens: torch.Tensor, logits_at: slice | None = None, **_: object) -> torch.Tensor:
        out = torch.full((*tokens.shape, VOCAB), float("-inf"))
        for row, state in enumerate(tokens.tolist()):
            self.states.append(tuple(state))
            wanted = self.script(tuple(state))
            for position in range(tokens.shape[1]):
                token, p = wanted.get(position, (0, 0.25))
                rest = (1 - p) / (VOCAB - 2)
                out[row, position, :M] = torch.tensor([p if t == token else rest for t in range(M)]).log()
        return out if logits_at is None else out[:, logits_at]


def sample(sampler: object, script: Script, rows: list[list[int]], stop: StopCondition | None = None
           ) -> tuple[list[list[int]], list[int], list[int], Scripted]:
    net = Scripted(script)
    counter = ForwardCounter(net, len(rows))
    out = sampler.sample(counter, torch.tensor(rows), M, stop=stop)  # type: ignore[attr-defined]
    return out.tokens.tolist(), counter.nfe.tolist(), counter.nfe_to_stop.tolist(), net


def edit_once(p_edit: float) -> Script:
    """Step 0 reveals position 1 as token 1 (0.95; position 2's 0.6 is short of tau 0.9); step 1 reveals position 2
    as 2 while the model now prefers 3 at position 1 with probability `p_edit`; afterwards every position prefers
    its own token at 0.95, so a post step changes nothing."""
    def script(state: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        if state == (0, M, M):
            return {1: (1, 0.95), 2: (2, 0.6)}
        if state == (0, 1, M):
            return {1: (3, p_edit), 2: (2, 0.95)}
        return {1: (state[1], 0.95), 2: (state[2], 0.95)}
    return script


def editing(threshold: float, post_steps: int = 16, base: object | None = None) -> EditingSampler:
    return EditingSampler(base=base or ThresholdSampler(tau=0.9), threshold=threshold, post_steps=post_steps)


@pytest.mark.parametrize("p_edit, threshold, edited", [(0.6, 0.5, True), (0.6, 0.6, False), (0.6, 0.7, False),
                                                       (0.99, 0.9, True), (0.6, 0.0, True), (0.99, 1.0, False)])
def test_an_edit_happens_exactly_when_another_token_is_preferred_above_the_threshold(
        p_edit: float, threshold: float, edited: bool) -> None:
    # forwards: step 0 (reveal 1), step 1 (reveal 2, maybe edit 1), one post step that changes nothing: 3
    tokens, nfe, _, _ = sample(editing(threshold), edit_once(p_edit), [[0, M, M]])
    assert tokens == [[0, 3 if edited else 1, 2]] and nfe == [3]


def test_without_post_steps_the_block_ends_when_full_and_without_editing_nothing_changes() -> None:
    assert sample(editing(0.5, post_steps=0), edit_once(0.6), [[0, M, M]])[:2] == ([[0, 3, 2]], [2])
    plain_tokens, plain_nfe, _, _ = sample(ThresholdSampler(tau=0.9), edit_once(0.6), [[0, M, M]])
    assert (plain_tokens, plain_nfe) == ([[0, 1, 2]], [2])
    # editing that never edits (threshold 1) still spends one post step on the full block, as LLaDA2.1's generate
    assert sample(editing(1.0), edit_once(0.99), [[0, M, M]])[:2] == ([[0, 1, 2]], [3])


def flip_flop(state: tuple[int, ...]) -> dict[int, tuple[int, float]]:
    """Both positions revealed at once (1 and 2 at 0.95); then position 1 always prefers the other of 1 and 3."""
    if state == (0, M, M):
        return {1: (1, 0.95), 2: (2, 0.95)}
    return {1: (3 if state[1] == 1 else 1, 0.9), 2: (2, 0.95)}


@pytest.mark.parametrize("post_steps, final", [(1, 3), (2, 1), (3, 3), (4, 1)])
def test_post_steps_that_keep_editing_stop_at_the_limit(post_steps: int, final: int) -> None:
    tokens, nfe, _, net = sample(editing(0.5, post_steps), flip_flop, [[0, M, M]])
    assert tokens == [[0, final, 2]] and nfe == [1 + post_steps]
    assert net.states == [(0, M, M)] + [(0, 1 if k % 2 == 0 else 3, 2) for k in range(post_steps)]


def test_an_earlier_block_is_never_edited_and_each_block_takes_its_post_steps() -> None:
    # blocks of one position: block 0 reveals 1, its first post step edits it to 3 (0.9 > 0.5), its second changes
    # nothing; block 1 reveals 2, and its post step would move position 1 back to 1 (0.99) but block 0 is closed
    def script(state: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        return {(0, M, M): {1: (1, 0.95)}, (0, 1, M): {1: (3, 0.9)}, (0, 3, M): {1: (3, 0.95), 2: (2, 0.95)},
                (0, 3, 2): {1: (1, 0.99), 2: (2, 0.95)}}[state]
    base = ThresholdSampler(tau=0.9, block_length=1)
    tokens, nfe, _, net = sample(editing(0.5, base=base), script, [[0, M, M]])
    assert tokens == [[0, 3, 2]] and nfe == [5]
    assert net.states == [(0, M, M), (0, 1, M), (0, 3, M), (0, 3, M), (0, 3, 2)]


def test_a_stop_waits_for_its_block_to_close() -> None:
    # the stop token 3 is written at step 1 by an edit; the block closes after the post step, where the row stops
    stop = StopCondition.of([3])
    _, nfe, at_stop, _ = sample(editing(0.5), edit_once(0.6), [[0, M, M]], stop)
    assert nfe == [3] and at_stop == [3]
    # without editing the decided token is final at once: a stop on token 1 is met when it is revealed
    _, nfe, at_stop, _ = sample(ThresholdSampler(tau=0.9), edit_once(0.6), [[0, M, M]], StopCondition.of([1]))
    assert at_stop == [1]


def test_a_batch_gives_each_row_its_own_run() -> None:
    def script(state: tuple[int, ...]) -> dict[int, tuple[int, float]]:
        return flip_flop(state) if state[0] == 0 else edit_once(0.6)((0, *state[1:]))
    rows = [[0, M, M], [1, M, M], [0, M, M]]
    batched = sample(editing(0.5, post_steps=3), script, rows)
    for index, row in enumerate(rows):
        alone = sample(editing(0.5, post_steps=3), script, [row])
        assert batched[0][index] == alone[0][0] and batched[1][index] == alone[1][0]


@pytest.mark.parametrize("base", [TopKSampler(k=1), EBSampler(gamma=0.1), StepsSampler(steps=2), FactorSampler(),
                                  KlassSampler(), M2TSampler(tau=0.9)], ids=lambda b: type(b).__name__)
def test_every_budget_takes_a_post_step_with_no_mask_left(base: object) -> None:
    tokens, nfe, _, _ = sample(editing(0.5, post_steps=2, base=base), edit_once(0.6), [[0, M, M]])
    assert tokens[0][2] == 2 and nfe[0] >= 3


def ranked(confidence: list[float]) -> Ranked:
    values = torch.tensor([confidence])
    return Ranked(entropy=torch.zeros_like(values), confidence=values, n_eligible=torch.tensor([len(confidence)]),
                  step_in_block=torch.tensor([0]), block_size=torch.tensor([len(confidence)]))


def test_the_m2t_count_is_strictly_above_tau_or_at_least_num_to_transfer() -> None:
    assert TransferThreshold(0.8, 1)(ranked([0.9, 0.8, 0.5])).tolist() == [1]  # 0.8 is not above 0.8
    assert TransferThreshold(0.8, 2)(ranked([0.9, 0.8, 0.5])).tolist() == [2]
    assert TransferThreshold(0.4, 1)(ranked([0.9, 0.8, 0.5])).tolist() == [3]
    assert TransferThreshold(0.95, 5)(ranked([0.9, 0.8, 0.5])).tolist() == [3]
    assert TransferThreshold(0.95, 1)(ranked([0.9, 0.8, 0.5])).tolist() == [1]


def test_the_window_masks() -> None:
    positions = torch.arange(4)
    valid = torch.tensor([[True, True, True, False]])
    causal = window_mask(positions, valid, 2, "block_causal")[0, 0]
    assert causal.tolist() == [[True, True, False, False], [True, True, False, False],
                               [True, True, True, False], [True, True, True, False]]
    added = window_mask(positions, valid, 2, "reference")[0, 0]
    inf = float("-inf")
    assert added.tolist() == [[1, 1, 0, inf], [1, 1, 0, inf], [1, 1, 1, inf], [1, 1, 1, inf]]


def test_settings_are_checked_in_one_line() -> None:
    def node(**fields: object) -> object:
        return build({"_target_": "mdmkit.samplers.EditingSampler", **fields}, "sampler")

    with pytest.raises(ConfigError, match="threshold=-0.1 must be >= 0"):
        node(threshold=-0.1)
    with pytest.raises(ConfigError, match="post_steps=-1 must be >= 0"):
        node(post_steps=-1)
    with pytest.raises(ConfigError, match="num_to_transfer=0 must be >= 1"):
        M2TSampler(num_to_transfer=0)
    with pytest.raises(ConfigError, match="attention='causal': expected one of 'block_causal', 'reference'"):
        Llada21Sampler(attention="causal")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_length must be null"):
        Llada21Sampler(rule=EditingSampler(base=M2TSampler(block_length=8)))


def test_the_options_compose_and_llada2_1_refuses_a_bidirectional_network() -> None:
    assert isinstance(api.sampler("editing", threshold=0.5).base, ThresholdSampler)
    decoder = api.sampler("llada2_1")
    assert isinstance(decoder, Llada21Sampler) and decoder.attention == "block_causal"
    assert isinstance(decoder.rule, EditingSampler) and isinstance(decoder.rule.base, M2TSampler)
    assert (decoder.rule.base.tau, decoder.rule.threshold, decoder.rule.post_steps) == (0.7, 0.5, 16)
    with pytest.raises(CapabilityError, match="block-causal"):
        decoder.sample(ForwardCounter(Scripted(flip_flop), 1), torch.tensor([[0, M, M]]), M)


def test_block_diffusion_takes_token_editing_as_its_rule() -> None:
    # on the tiny LLaDA2.0 network (skipped without the shared fixtures): each block's rule is M2T with editing, its
    # post steps counted; the walk's exact cache adds one committing forward per finished block
    from test_llada2_1_generate import FIXTURE, network

    if not FIXTURE.is_dir():
        pytest.skip(f"LLaDA2.x fixture not found: {FIXTURE}")
    prompt = [723, 148, 481, 129, 117, 66, 816, 515, 552, 911]
    runs = {}
    for rule in (EditingSampler(base=M2TSampler(tau=0.7), threshold=0.5, post_steps=4), M2TSampler(tau=0.7)):
        sampler = BlockDiffusionSampler(block_size=16, sub_block=16, commit_reveals=False, rule=rule)
        runs[type(rule)] = api.fill(network(), [prompt], sampler, 22, 1023)
    edited, plain = runs[EditingSampler], runs[M2TSampler]
    assert 1023 not in edited.tokens[0].tolist()
    assert int(edited.nfe[0]) >= int(plain.nfe[0]) + 2  # a post step at least in each of its two blocks
    with pytest.raises(ConfigError, match="rule.block_length must be null"):
        BlockDiffusionSampler(rule=EditingSampler(base=M2TSampler(block_length=4)))


def test_editing_under_the_masked_loops_caches_is_exact_when_they_refresh_every_step() -> None:
    # on the tiny LLaDA (skipped without the shared fixtures): post steps run through the prefix / dual cache like any
    # step, so refreshing it every step gives the uncached tokens and NFE
    from test_llada2_1_generate import FIXTURE

    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    llada = FIXTURE.parent / "llada"
    if not llada.is_dir():
        pytest.skip(f"LLaDA fixture not found: {llada}")
    net = load_diffusion_lm(llada, "llada", mask_id=1023)
    prompts = [[5, 17, 300, 41, 9, 77, 12], [800, 3, 14]]
    runs = []
    for cache, refresh in (("none", None), ("dual", 1), ("prefix", 1)):
        base = ThresholdSampler(tau=0.3, block_length=8, cache=cache, cache_refresh=refresh, mask_in_softmax=True)
        filled = api.fill(net, prompts, EditingSampler(base=base, threshold=0.2, post_steps=4), 24, 1023)
        runs.append((filled.tokens.tolist(), filled.nfe.tolist()))
    assert runs[0] == runs[1] == runs[2]
    assert min(runs[0][1]) > 24 // 8 * 2  # at least one step and one post step per block

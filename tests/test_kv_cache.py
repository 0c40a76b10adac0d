"""Approximate KV caches for masked diffusion (`cache=prefix|dual`): what is exact, what is counted, what is refused.

The caches are approximations only through staleness: a refreshing forward is the plain forward, and a query
forward on the state the cache was written from gives the plain forward's logits. Those properties, the
unchanged plain loop, NFE and the computed-token counts are tested exactly here, on mdmkit's own transformer
(the protocol is all the code depends on).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from fakes import FixedLogits, random_transformer

from mdmkit.analysis.pareto import derive_family
from mdmkit.core.config import build
from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.evaluation.runner import EvalResult
from mdmkit.models.denoiser import KV_CACHE, positions_from, require_capabilities
from mdmkit.samplers import (
    DreamStepsSampler,
    EBSampler,
    FactorSampler,
    ForwardCounter,
    MaskedSampler,
    NISampler,
    RevealAllSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.core.kv_cache import BlockCache, block_spans
from mdmkit.samplers.core.masked import StepRule
from mdmkit.samplers.core.protocol import Canvas

V, MASK, L = 12, 11, 14
PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6], [5, 3]]
ANSWER = 9  # masks after every prompt
CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture(autouse=True)
def _threads(one_thread: None) -> None:
    """Tiny forwards: one intra-op thread."""


def network(**config: object) -> torch.nn.Module:
    return random_transformer(V, L, seed=0, head_scale=30.0, **config)


def text_canvas(prompts: list[list[int]] = PROMPTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts left-padded to the longest, then ANSWER masks (the padding mask: None where there is none)."""
    width = max(map(len, prompts))
    tokens = torch.full((len(prompts), width + ANSWER), MASK)
    keep = torch.ones_like(tokens, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        tokens[i, : width - len(prompt)] = 0
        keep[i, : width - len(prompt)] = False
        tokens[i, width - len(prompt): width] = torch.tensor(prompt)
    return tokens, None if bool(keep.all()) else keep


def puzzle_canvas() -> tuple[torch.Tensor, None]:
    """Masks scattered among given tokens (a Sudoku-like infilling canvas), no padding."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, MASK, (2, L), generator=generator)
    return tokens.masked_fill(torch.rand(2, L, generator=generator) < 0.6, MASK), None


def run(sampler: MaskedSampler, net: torch.nn.Module, tokens: torch.Tensor,
        keep: torch.Tensor | None = None) -> tuple[torch.Tensor, ForwardCounter]:
    counter = ForwardCounter(net, tokens.shape[0])
    sampled = sampler.sample(counter, tokens, MASK, torch.Generator().manual_seed(3), attention_mask=keep)
    assert not (sampled.tokens == MASK).any()
    assert torch.equal(counter.nfe, sampled.steps)  # one forward per step, cache or not
    return sampled.tokens, counter


def with_cache(sampler: MaskedSampler, cache: str, **fields: object) -> MaskedSampler:
    return type(sampler)(**{**sampler.__dict__, "cache": cache, **fields})


SAMPLERS = {
    "topk1": TopKSampler(k=1),
    "topk2_b4": TopKSampler(k=2, block_length=4),
    "eb_b4": EBSampler(gamma=0.5, block_length=4, ordering="entropy"),
    "threshold_b3": ThresholdSampler(tau=0.3, block_length=3),
    "factor_b4": FactorSampler(factor=2.0, block_length=4, ordering="margin"),
    "steps_b4": StepsSampler(steps=3, block_length=4),
    "dream_b4": DreamStepsSampler(steps=5, block_length=4),
    "all_b4": RevealAllSampler(block_length=4),
}
BLOCKED = {name: sampler for name, sampler in SAMPLERS.items() if sampler.block_length is not None}
CANVASES = {"text": text_canvas, "puzzle": puzzle_canvas}

# NFE and a digest of the tokens of each (canvas, sampler), recorded from the loop before caches existed
BEFORE = {
    ("text", "topk1"): ([9, 9, 9], "ef348e63e7f8"),
    ("text", "topk2_b4"): ([5, 5, 5], "abdaec1d3718"),
    ("text", "eb_b4"): ([8, 8, 8], "6ddb544114da"),
    ("text", "threshold_b3"): ([3, 3, 4], "c3e0dff5cdc7"),
    ("text", "factor_b4"): ([5, 6, 5], "eec9bc83d7a9"),
    ("text", "steps_b4"): ([7, 7, 7], "eec9bc83d7a9"),
    ("text", "dream_b4"): ([9, 9, 9], "eec9bc83d7a9"),
    ("text", "all_b4"): ([3, 3, 3], "700ba9f59cad"),
    ("puzzle", "topk1"): ([7, 8], "bada0df954d4"),
    ("puzzle", "topk2_b4"): ([4, 4], "3f085dba1383"),
    ("puzzle", "eb_b4"): ([6, 7], "c0ba66523fb3"),
    ("puzzle", "threshold_b3"): ([3, 3], "31c3ba9fd690"),
    ("puzzle", "factor_b4"): ([4, 5], "bada0df954d4"),
    ("puzzle", "steps_b4"): ([6, 6], "bada0df954d4"),
    ("puzzle", "dream_b4"): ([7, 8], "bada0df954d4"),
    ("puzzle", "all_b4"): ([2, 2], "9c2e9e669fbb"),
}


class Recording(torch.nn.Module):
    """`inner` (capabilities included), recording every call: (tokens, commit, cache given, logits)."""

    capabilities = frozenset({KV_CACHE})

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, []

    @property
    def n_layers(self) -> int:
        return self.inner.n_layers

    def forward(self, tokens: torch.Tensor, attn_mask: object = None, **kwargs: object) -> torch.Tensor:
        logits = self.inner(tokens, attn_mask, **kwargs)
        self.calls.append((tokens.clone(), kwargs.get("commit", 0), kwargs.get("cache") is not None, logits))
        return logits


# -- cache=none is the loop as it was -------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BEFORE), ids="-".join)
def test_no_cache_is_bit_identical_to_the_loop_before_caches(case: tuple[str, str]) -> None:
    tokens, keep = CANVASES[case[0]]()
    filled, counter = run(SAMPLERS[case[1]], network(), tokens, keep)
    assert counter.nfe.tolist() == BEFORE[case][0]
    assert hashlib.sha256(str(filled.tolist()).encode()).hexdigest()[:12] == BEFORE[case][1]
    assert counter.tokens.tolist() == [n * tokens.shape[1] for n in BEFORE[case][0]]  # full forwards


# -- the machinery is exact ----------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_a_cache_refreshed_at_every_step_is_the_plain_loop(cache: str, name: str) -> None:
    # no padding here: the cached path counts positions from the first real token, mdmkit's plain call does not
    tokens, keep = text_canvas([[3, 1, 4], [1, 5, 9], [5, 3, 2]])
    assert keep is None
    plain, cached = Recording(network()), Recording(network())
    expected, plain_counter = run(BLOCKED[name], plain, tokens)
    filled, counter = run(with_cache(BLOCKED[name], cache, cache_refresh=1), cached, tokens)
    assert torch.equal(filled, expected) and torch.equal(counter.nfe, plain_counter.nfe)
    assert len(cached.calls) == len(plain.calls)
    for (_, _, _, want), (_, commit, _, got) in zip(plain.calls, cached.calls):
        assert commit == tokens.shape[1] and torch.equal(got, want)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("canvas", sorted(CANVASES))
def test_cached_logits_at_the_first_step_of_every_block_are_the_plain_forward(cache: str, canvas: str) -> None:
    tokens, _ = CANVASES[canvas]()
    tokens = tokens[:1]  # one row: its refreshes are its block starts
    net = Recording(network())
    run(TopKSampler(k=1, block_length=4, cache=cache), net, tokens)
    refreshes = [call for call in net.calls if call[1] == tokens.shape[1]]
    assert len(refreshes) == -(-int((tokens == MASK).sum()) // 4)  # one per block
    for state, _, _, logits in refreshes:
        assert torch.equal(logits, net.inner(state))
    assert all(cache_given for _, _, cache_given, _ in net.calls)


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_query_forward_on_the_cached_state_gives_the_plain_logits(cache: str, positions: str) -> None:
    net = random_transformer(V, L, seed=0, positions=positions)
    state = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(3, L, dtype=torch.bool)
    keep[0, :3], keep[2, :1] = False, False  # left padding
    in_block = torch.zeros(3, L, dtype=torch.bool)
    in_block[0, 5:9], in_block[1, 9:13], in_block[2, 6:8] = True, True, True  # rows at different blocks
    rows = torch.arange(3)
    counter = ForwardCounter(net, 3)
    blocks = BlockCache(cache, counter, keep, L)
    plain = net(state, keep[:, None, None, :], positions=positions_from(keep))
    assert torch.equal(blocks.logits(rows, state, in_block, torch.ones(3, dtype=torch.bool), slice(0, L)), plain)
    queried = blocks.logits(rows, state, in_block, torch.zeros(3, dtype=torch.bool), slice(0, L))
    start, end = block_spans(in_block)
    assert start.tolist() == [5, 9, 6] and end.tolist() == [9, 13, 8]
    end = torch.full_like(end, L) if cache == "prefix" else end  # queries: the block (prefix: and what follows)
    columns = torch.arange(L)
    ran = (columns >= start[:, None]) & (columns < end[:, None])
    assert torch.allclose(queried[ran], plain[ran], atol=1e-5)
    assert (queried[~ran] == 0).all()
    width = int((end - start).max())  # rows are padded to the widest query
    assert counter.tokens.tolist() == [L + width] * 3 and counter.nfe.tolist() == [2, 2, 2]


# -- batching, left padding, every option -----------------------------------------------------------


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_batched_rows_with_left_padding_equal_their_single_runs(cache: str, name: str) -> None:
    net = network()
    tokens, keep = text_canvas()
    sampler = with_cache(BLOCKED[name], cache)
    batched, counter = run(sampler, net, tokens, keep)
    for row, prompt in enumerate(PROMPTS):
        alone_tokens, alone_keep = text_canvas([prompt])
        alone, alone_counter = run(sampler, net, alone_tokens, alone_keep)
        assert torch.equal(batched[row][keep[row]], alone[0])
        assert counter.nfe[row] == alone_counter.nfe[0]
        assert (batched[row][~keep[row]] == 0).all()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("canvas", sorted(CANVASES))
@pytest.mark.parametrize("name", ["threshold_b3", "factor_b4"])
def test_rows_at_different_blocks_and_leaving_early_equal_their_single_runs(name: str, canvas: str,
                                                                            cache: str) -> None:
    # less confident logits: rows reveal different counts, so some steps refresh some rows and query the others
    # (two calls in one step); rows finish at different steps and leave the cache
    net = Recording(random_transformer(V, L, seed=0, head_scale=10.0))
    tokens, keep = CANVASES[canvas]()
    sampler = with_cache(BLOCKED[name], cache)
    batched, counter = run(sampler, net, tokens, keep)
    assert len(net.calls) > int(counter.nfe.max())  # steps with refreshing and cached rows
    for row in range(tokens.shape[0]):
        if keep is None:
            alone_tokens, alone_keep = tokens[row: row + 1], None
        else:
            alone_tokens, alone_keep = text_canvas([PROMPTS[row]])
        alone, alone_counter = run(sampler, net, alone_tokens, alone_keep)
        real = slice(None) if keep is None else keep[row]
        assert torch.equal(batched[row][real], alone[0]) and counter.nfe[row] == alone_counter.nfe[0]


MASKED_OPTIONS = sorted(p.stem for p in (CONF / "sampler").glob("*.yaml")
                        if issubclass(build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={p.stem}"]).sampler,
                                            "sampler").__class__, MaskedSampler))


def test_every_masked_sampler_option_is_listed() -> None:
    assert {"topk", "eb", "threshold", "factor", "steps", "all", "llada", "fastdllm_threshold", "fastdllm_factor",
            "dream_maskgit_plus", "dream_entropy", "dream_origin", "dream_topk_margin"} <= set(MASKED_OPTIONS)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("option", MASKED_OPTIONS)
def test_every_masked_sampler_option_runs_with_every_cache(option: str, cache: str) -> None:
    config = compose_config("evaluate", ["ckpt=x.pt", f"sampler={option}", f"sampler.cache={cache}"]).sampler
    if config.block_length is None:
        config.block_length = 4
    sampler = build(config, "sampler")
    assert sampler.cache == cache and sampler.requires == (frozenset() if cache == "none" else {KV_CACHE})
    tokens, keep = text_canvas()
    _, counter = run(sampler, network(), tokens, keep)
    assert (counter.tokens <= counter.nfe * tokens.shape[1]).all()


# -- what is counted ----------------------------------------------------------------------------


def block_starts(prompt: int, answer: int, block: int) -> list[tuple[int, int]]:
    """(first position, size) of each block of an answer suffix after `prompt` tokens."""
    return [(prompt + b, min(block, answer - b)) for b in range(0, answer, block)]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_nfe_is_one_forward_per_step_whatever_the_cache(cache: str) -> None:
    net, (tokens, keep) = network(), text_canvas()
    blocks = len(block_starts(5, ANSWER, 4))
    assert run(TopKSampler(k=1, block_length=4, cache=cache), net, tokens, keep)[1].nfe.tolist() == [ANSWER] * 3
    assert run(RevealAllSampler(block_length=4, cache=cache), net, tokens, keep)[1].nfe.tolist() == [blocks] * 3
    steps = sum(min(2, size) for _, size in block_starts(5, ANSWER, 4))
    assert run(StepsSampler(steps=2, block_length=4, cache=cache), net, tokens, keep)[1].nfe.tolist() == [steps] * 3


@pytest.mark.parametrize("refresh", [None, 2])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_computed_tokens_are_what_each_forward_ran(cache: str, refresh: int | None) -> None:
    tokens, _ = text_canvas([PROMPTS[1]])  # one row: prompt 5, answer 9, canvas 14
    _, counter = run(TopKSampler(k=1, block_length=4, cache=cache, cache_refresh=refresh), network(), tokens)
    expected = 0
    for start, size in block_starts(5, ANSWER, 4):
        for step in range(size):  # k=1: one step per position
            if step == 0 or (refresh is not None and step % refresh == 0):
                expected += L  # a full forward
            else:  # prefix: the block and everything right of it; dual: the block
                expected += L - start if cache == "prefix" else size
    assert counter.tokens.tolist() == [expected]
    assert counter.nfe.tolist() == [ANSWER]


def test_the_counter_charges_each_row_the_width_of_its_calls() -> None:
    counter = ForwardCounter(FixedLogits(torch.zeros(4, 3)), 3)
    counter(torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 2]))
    counter(torch.zeros(1, 3, dtype=torch.long), torch.tensor([2]))
    assert counter.tokens.tolist() == [4, 0, 7] and counter.nfe.tolist() == [1, 0, 2]


def test_results_report_tokens_per_forward() -> None:
    nfe = torch.tensor([4, 6]).numpy()
    result = EvalResult(torch.tensor([True, False]).numpy(), nfe, 1.0, torch.zeros(2, 1),
                        computed_tokens=torch.tensor([40, 20]).numpy())
    summary = result.summary()
    assert summary["tokens_per_forward_mean"] == pytest.approx(60 / 10)
    assert summary["computed_tokens_mean"] == pytest.approx(30.0)
    assert EvalResult(result.correct, nfe, 1.0, result.predictions).summary()["tokens_per_forward_mean"] is None


# -- refusals, labels, keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: EBSampler(cache="prefix"), "cache=prefix needs block_length"),
        (lambda: ThresholdSampler(cache="dual"), "cache=dual needs block_length"),
        (lambda: TopKSampler(cache="full", block_length=4), "cache='full': expected one of 'none', 'prefix', 'dual'"),
        (lambda: TopKSampler(cache="dual", block_length=4, cache_refresh=0), "cache_refresh=0 must be >= 1"),
        (lambda: TopKSampler(block_length=4, cache_refresh=2), "cache_refresh=2 needs a cache"),
    ],
)
def test_bad_cache_settings_fail_at_construction(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_cache_needs_the_kv_cache_capability() -> None:
    sampler = ThresholdSampler(block_length=4, cache="prefix")
    with pytest.raises(CapabilityError, match="kv_cache"):
        require_capabilities(sampler, FixedLogits(torch.zeros(L, V)))
    require_capabilities(ThresholdSampler(block_length=4), FixedLogits(torch.zeros(L, V)))


def test_ni_sampling_refuses_a_cached_base_when_built_and_needs_the_bases_capabilities() -> None:
    silent = lambda masked, logits, hidden: torch.zeros(masked.shape)
    with pytest.raises(ConfigError, match="cache=dual is not supported under NI sampling"):
        NISampler(base=TopKSampler(block_length=4, cache="dual"), epsilon=0.5, indicator=silent)
    base_alone = NISampler(base=TopKSampler(block_length=4, cache="prefix"), epsilon=1.0)  # the indicator never runs
    assert base_alone.requires == {"kv_cache"}
    with pytest.raises(CapabilityError, match="kv_cache"):
        require_capabilities(base_alone, FixedLogits(torch.zeros(L, V)))
    net = Recording(network())
    reads_hidden = type("ReadsHidden", (StepRule,), {"needs_hidden": True})
    with pytest.raises(ConfigError, match="a rule that reads hidden states needs full forwards: cache=dual"):
        canvas = Canvas(text_canvas([PROMPTS[0]])[0], MASK)
        TopKSampler(block_length=4, cache="dual").fill_with(ForwardCounter(net, 1), canvas,
                                                            reads_hidden(canvas.tokens == MASK))
    assert not net.calls


def test_families_name_the_cache_only_where_there_is_one() -> None:
    eb = {"_target_": "mdmkit.samplers.EBSampler", "ordering": "confidence", "gamma": 0.1, "block_length": 32}
    plain, dual = {**eb, "cache": "none", "cache_refresh": None}, {**eb, "cache": "dual", "cache_refresh": None}
    ni = {"_target_": "mdmkit.samplers.NISampler", "base": plain, "epsilon": 0.9}
    assert derive_family({"sampler": plain}) == derive_family({"sampler": eb}) == "eb-confidence"
    assert derive_family({"sampler": dual}) == "eb-confidence+dual"
    assert derive_family({"sampler": {**ni, "base": {**eb, "cache": "prefix"}}}) == "ni-eb-confidence+prefix"


def test_text_generation_reports_computed_tokens_and_batches_with_a_cache() -> None:
    pytest.importorskip("transformers")
    from tiny_text_models import byte_level_tokenizer

    from mdmkit.evaluation.generation import TextModel, generate

    tokenizer = byte_level_tokenizer()
    net = random_transformer(len(tokenizer), 64, seed=0, head_scale=30.0)
    net.mask_id = tokenizer.mask_token_id
    model = TextModel(net, tokenizer)
    prompts = ["def add(a, b):\n", "Question: a longer prompt?\nAnswer:", "x"]
    for cache in ("none", "dual"):
        sampler = ThresholdSampler(tau=0.3, block_length=4, cache=cache)
        batched = generate(model, prompts, sampler, 8, [], batch_size=3, progress=False)
        alone = [generate(model, [p], sampler, 8, [], batch_size=1, progress=False) for p in prompts]
        if cache != "none":  # mdmkit's plain call counts positions from the padding, the cached path does not
            assert batched.raw == [a.raw[0] for a in alone]
            assert batched.nfe.tolist() == [int(a.nfe[0]) for a in alone]
        widths = [len(tokenizer(p)["input_ids"]) + 8 for p in prompts]
        if cache == "none":  # every forward runs the whole (padded) canvas
            assert batched.computed_tokens.tolist() == [int(n) * max(widths) for n in batched.nfe]
            assert [int(a.computed_tokens[0]) for a in alone] == [int(a.nfe[0]) * w for a, w in zip(alone, widths)]
        else:
            assert (batched.computed_tokens < batched.nfe * max(widths)).all()

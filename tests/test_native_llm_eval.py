"""Every masked sampler x KV cache on the tiny LLaDA and Dream fixtures, through `evaluate.py task=gsm8k` and
through `mdmkit-lm-eval --tasks mdmkit_gsm8k` (issue 15).

The fixtures (`../shared/reference_models`, or `$MDMKIT_REFERENCE_MODELS`) become user checkpoint directories
with a tiny byte-level tokenizer (a token per byte, so prompts are cut to `MAX_LENGTH` tokens with the answer);
the GSM8K files are `BENCHMARK_DATA`'s. Without shots, the first two test prompts (300 and 123 bytes) batch
with left padding. The networks are random: what is checked is that every combination runs and what each row
reports (its sampler, family, NFE, tokens per forward), not accuracy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import BENCHMARK_DATA, ROOT, compose_config, run_cli
from hydra import initialize_config_module
from omegaconf import open_dict
from tiny_text_models import native_checkpoint_dir

from mdmkit.core.config import build
from mdmkit.evaluation.sweep import sampler_preset
from mdmkit.samplers import (
    DreamStepsSampler,
    ForwardCounter,
    MaskedSampler,
    RevealAllSampler,
    StepsSampler,
    TopKSampler,
)
from mdmkit.samplers.core.kv_cache import BlockCache

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
needs_models = pytest.mark.skipif(
    not all((REFERENCE / kind / "model.safetensors").is_file() for kind in ("llada", "dream")),
    reason=f"reference model fixtures not found: {REFERENCE}")
needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")
pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("transformers")

KINDS = ["llada", "dream"]
CACHES = ["none", "prefix", "dual"]
GEN, BLOCK, MAX_LENGTH = 16, 8, 160  # answer tokens, blocks where the option has none, prompt + answer tokens
with initialize_config_module("mdmkit.conf", version_base="1.3"):  # composed once, each job takes a copy
    PRESETS = {p.stem: sampler_preset(p.stem) for p in sorted((ROOT / "conf" / "sampler").glob("*.yaml"))}
OPTIONS = [name for name, preset in PRESETS.items() if isinstance(build(preset, name), MaskedSampler)]
# a budget fixed by the schedule: the same NFE whatever the cache (adaptive rules read the approximate logits)
SCHEDULED_TYPES = (TopKSampler, StepsSampler, DreamStepsSampler, RevealAllSampler)
SCHEDULED = {name for name in OPTIONS if isinstance(build(PRESETS[name], name), SCHEDULED_TYPES)}


def settings(option: str) -> dict[str, object]:
    """Fields set on top of the option: blocks of 8 where it has none, 4 steps (per block) where it counts them."""
    preset = PRESETS[option]
    return {**({"block_length": BLOCK} if preset["block_length"] is None else {}),
            **({"steps": 4} if "steps" in preset else {})}


def preset_copy(*name: str) -> dict[str, object]:
    """`sampler_preset(name)` (or `option("sampler", name)`) without composing it again (a tenth of a second)."""
    return dict(PRESETS[name[-1]])


def expected_sampler(option: str, cache: str) -> dict[str, object]:
    return {**PRESETS[option], **settings(option), "cache": cache}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("native")
    return {kind: native_checkpoint_dir(REFERENCE / kind, kind, root / kind) for kind in KINDS}


def evaluate_overrides(kind: str, checkpoint: Path, results: Path) -> list[str]:
    return ["task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0", f"task.max_gen_len={GEN}",
            f"ckpt={checkpoint}", f"hf.kind={kind}", f"hf.max_length={MAX_LENGTH}", "limit=2", "batch_size=2",
            "device=cpu", f"results_file={results}", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def evaluated(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Per model: the rows of one `evaluate` run over every option x cache (a sweep: the model loads once)."""
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    rows, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)  # as `one_thread`, which is set up after module fixtures
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("mdmkit.evaluation.sweep.sampler_preset", preset_copy)
            for kind in KINDS:
                results = tmp_path_factory.mktemp(f"evaluate-{kind}") / "rows.jsonl"
                cfg = compose_config("evaluate", evaluate_overrides(kind, checkpoints[kind], results))
                with open_dict(cfg):
                    cfg.sweep = {"name": "every_cache", "entries": [
                        {"sampler": option, "grid": {"cache": CACHES, **settings(option)}} for option in OPTIONS]}
                rows[kind] = run_evaluation(plan_evaluation(cfg))
                written = [json.loads(line)["key"] for line in results.read_text().splitlines()]
                assert [r["key"] for r in rows[kind]] == written
    finally:
        torch.set_num_threads(threads)
    return rows


def by_option(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{option: {cache: row}}, rows in the sweep's order (options, then caches)."""
    return {option: {row["sampler"]["cache"]: row for row in rows[i * 3: i * 3 + 3]}
            for i, option in enumerate(OPTIONS)}


def test_every_masked_sampler_option_is_covered() -> None:
    assert {"topk", "steps", "eb", "threshold", "factor", "all", "llada", "fastdllm_threshold", "fastdllm_factor",
            "dream_maskgit_plus", "dream_topk_margin", "dream_entropy", "dream_origin"} <= set(OPTIONS)


# -- evaluate.py task=gsm8k ----------------------------------------------------------------------------------


@needs_models
@needs_data
@pytest.mark.parametrize("kind", KINDS)
def test_every_sampler_and_cache_writes_a_row_naming_its_cache(kind: str, evaluated) -> None:
    rows = evaluated[kind]
    assert len(rows) == 3 * len(OPTIONS) and len({r["key"] for r in rows}) == len(rows)
    for option, cached in by_option(rows).items():
        assert sorted(cached) == sorted(CACHES), option
        for cache, row in cached.items():
            assert row["weights"] == kind and row["task"] == "gsm8k" and row["n"] == 2
            assert row["sampler"] == expected_sampler(option, cache)
            assert row["family"].endswith(f"+{cache}") == (cache != "none"), row["family"]
            generations = Path(row["config"]["results_file"]).parent / "generations" / f"gsm8k-{row['key']}.jsonl"
            assert len(generations.read_text().splitlines()) == 2


@needs_models
@needs_data
@pytest.mark.parametrize("kind", KINDS)
def test_nfe_and_tokens_per_forward_are_consistent_across_caches(kind: str, evaluated) -> None:
    for option, cached in by_option(evaluated[kind]).items():
        # without a cache every forward runs the whole canvas: the first prompt cut to fit, the second padded
        assert cached["none"]["tokens_per_forward_mean"] == MAX_LENGTH, option
        blocks = -(-GEN // cached["none"]["sampler"]["block_length"])
        for cache, row in cached.items():
            assert blocks <= row["nfe"]["min"] and row["nfe"]["max"] <= GEN, (option, cache)
            assert row["nfe_to_stop_mean"] <= row["nfe_mean"]
            assert row["computed_tokens_mean"] == pytest.approx(row["tokens_per_forward_mean"] * row["nfe_mean"])
            if option in SCHEDULED:
                assert row["nfe"] == cached["none"]["nfe"], (option, cache)
            if cache != "none":  # a block's first step is a full forward, its later ones run fewer tokens
                fewer = row["tokens_per_forward_mean"] < MAX_LENGTH
                assert fewer == (row["nfe"]["min"] > blocks), (option, cache)
        assert cached["dual"]["tokens_per_forward_mean"] <= cached["prefix"]["tokens_per_forward_mean"], option


@needs_models
@needs_data
@pytest.mark.parametrize("kind", KINDS)
def test_top1_computes_exactly_the_tokens_of_its_cached_forwards(kind: str, evaluated) -> None:
    # k = 1: 8 steps per block of 8, a full forward then 7 queries from the block (Dream, whose logits are
    # shifted: from one position left of it) to the canvas end (prefix) or to the block end (dual)
    starts, left = range(MAX_LENGTH - GEN, MAX_LENGTH, BLOCK), int(kind == "dream")
    expected = {"none": GEN * MAX_LENGTH,
                "prefix": sum(MAX_LENGTH + (BLOCK - 1) * (MAX_LENGTH - start + left) for start in starts),
                "dual": len(starts) * (MAX_LENGTH + (BLOCK - 1) * (BLOCK + left))}
    for cache, row in by_option(evaluated[kind])["topk"].items():
        assert row["nfe"]["min"] == row["nfe"]["max"] == GEN
        assert row["computed_tokens_mean"] == expected[cache], cache


@needs_models
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_cached_queries_on_the_cached_state_give_the_plain_logits(kind: str, checkpoints) -> None:
    # the native networks under left padding: the plain loop's forward (a key-padding mask; Dream counts
    # positions from the first real token and shifts its logits) against a refresh and a query on one state
    from mdmkit.evaluation.text_eval import HFModelConfig, load_text_model

    network = load_text_model(str(checkpoints[kind]), HFModelConfig(kind=kind), "cpu").network
    state = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(0))
    state[:, 28:] = network.mask_id
    keep = torch.ones_like(state, dtype=torch.bool)
    keep[0, :7] = False
    in_block = torch.zeros_like(keep)
    in_block[:, 24:32] = True  # four of the block's positions revealed, four masked
    plain = network(state, keep[:, None, None, :])
    rows, every, whole = torch.arange(2), torch.ones(2, dtype=torch.bool), slice(0, state.shape[1])
    for cache in ("prefix", "dual"):
        blocks = BlockCache(cache, ForwardCounter(network, 2), keep, state.shape[1])
        torch.testing.assert_close(blocks.logits(rows, state, in_block, every, whole)[keep], plain[keep], atol=1e-5,
                                   rtol=0)
        queried = blocks.logits(rows, state, in_block, ~every, whole)
        torch.testing.assert_close(queried[in_block], plain[in_block], atol=1e-5, rtol=0)
    # unpadded rows at one block: the query writes its window into the cache in place and attends without a mask;
    # the logits come only for the span asked (the block's masked columns), and again alike on a second query
    plain, span = network(state), slice(28, 32)
    for cache in ("prefix", "dual"):
        counter = ForwardCounter(network, 2)
        blocks = BlockCache(cache, counter, None, state.shape[1])
        torch.testing.assert_close(blocks.logits(rows, state, in_block, every, span), plain[:, span], atol=1e-5,
                                   rtol=0)
        for _ in range(2):
            torch.testing.assert_close(blocks.logits(rows, state, in_block, ~every, span), plain[:, span], atol=1e-5,
                                       rtol=0)
        window = 8 + (kind == "dream") if cache == "dual" else 40 - 24 + (kind == "dream")
        assert counter.tokens.tolist() == [40 + 2 * window] * 2


@needs_models
@needs_data
def test_the_evaluate_cli_runs_a_cached_sampler_on_dream(checkpoints, tmp_path: Path) -> None:
    results = tmp_path / "rows.jsonl"
    done = run_cli("evaluate.py", *evaluate_overrides("dream", checkpoints["dream"], results),
                   "sampler=dream_entropy", "sampler.steps=4", f"sampler.block_length={BLOCK}", "sampler.cache=dual",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dreamsteps-entropy+dual" in done.stdout
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["sampler"] == expected_sampler("dream_entropy", "dual") and row["family"] == "dreamsteps-entropy+dual"
    assert row["nfe_mean"] == 2 * 4 and row["tokens_per_forward_mean"] < MAX_LENGTH  # 2 blocks of 4 steps


# -- mdmkit-lm-eval --tasks mdmkit_gsm8k -----------------------------------------------------------------------


def test_model_args_none_is_the_string_where_the_field_is_one() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.utils import simple_parse_args_string

    from mdmkit.evaluation.lm_eval_model import sampler_from_args

    args = simple_parse_args_string("cache=none,block_length=none")  # lm-eval reads both as None
    sampler, config = sampler_from_args("eb", args)
    assert sampler.cache == config["cache"] == "none" and sampler.block_length is config["block_length"] is None


@needs_models
@needs_data
@pytest.mark.parametrize("kind", KINDS)
def test_every_sampler_and_cache_runs_through_lm_eval(kind: str, checkpoints, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    import mdmkit.evaluation.lm_eval_model  # noqa: F401  (registers model="mdmkit")
    from mdmkit.lm_eval_tasks import utils

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    # lm-eval describes the environment in every result (pip list and more in subprocesses: a second a call)
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)
    monkeypatch.setattr("mdmkit.evaluation.lm_eval_model.option", preset_copy)
    utils.task.cache_clear()
    tasks = TaskManager(include_path=str(Path(utils.__file__).parent), include_defaults=False)
    for option in OPTIONS:
        nfe = {}
        for cache in CACHES:
            fields = ",".join(f"{k}={v}" for k, v in {**settings(option), "cache": cache}.items())
            nfe_file = tmp_path / f"{option}-{cache}.jsonl"
            results = lm_eval.simple_evaluate(
                model="mdmkit", model_args=f"ckpt={checkpoints[kind]},kind={kind},max_length={MAX_LENGTH},"
                                           f"sampler={option},{fields},nfe_file={nfe_file}",
                gen_kwargs=f"max_gen_toks={GEN}", tasks=["mdmkit_gsm8k"], limit=2, batch_size=2, device="cpu",
                task_manager=tasks, verbosity="ERROR")
            assert "accuracy,none" in results["results"]["mdmkit_gsm8k"]
            records = [json.loads(line) for line in nfe_file.read_text().splitlines()]
            assert len(records) == 2 and all(r["sampler"] == expected_sampler(option, cache) for r in records)
            assert all(1 <= r["nfe_to_stop"] <= r["nfe"] <= GEN for r in records), (option, cache)
            nfe[cache] = [r["nfe"] for r in records]
        if option in SCHEDULED:
            assert nfe["prefix"] == nfe["dual"] == nfe["none"], option


@needs_models
@pytest.mark.parametrize("kind", KINDS)
def test_prompts_are_cut_to_the_models_positions_and_a_longer_max_length_is_refused(kind: str, checkpoints) -> None:
    """Without `hf.max_length` a prompt is cut to what the model's positions leave beside the generation (not a
    crash mid-run); a `max_length` past them is refused when the model loads."""
    from mdmkit.core.errors import ConfigError
    from mdmkit.evaluation.text_eval import HFModelConfig, load_text_model

    model = load_text_model(str(checkpoints[kind]), HFModelConfig(kind=kind), "cpu")
    positions = model.network.config.max_positions
    assert model.max_length == positions
    ids, cut = model.encode_prompt("a b " * positions, False, GEN)
    assert len(ids) == positions - GEN and cut
    assert model.encode_prompt("a b", False, GEN)[1] is False
    with pytest.raises(ConfigError, match=f"{positions} answer tokens leave no room for a prompt in the model's "
                                          f"{positions} positions: fewer answer tokens .*max_gen_toks=N"):
        model.encode_prompt("a b", False, positions)
    canvas = torch.full((1, positions), model.network.mask_id)
    canvas[0, : len(ids)] = torch.tensor(ids)
    assert model.network(canvas).shape[1] == positions  # the longest canvas runs
    with pytest.raises(ConfigError, match=f"max_length={positions + 1} is more than the {positions} positions"):
        load_text_model(str(checkpoints[kind]), HFModelConfig(kind=kind, max_length=positions + 1), "cpu")


@needs_models
@needs_data
def test_evaluate_and_lm_eval_give_equal_generations_verdicts_and_nfe(checkpoints, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same documents through `evaluate.py` and `mdmkit-lm-eval`: one answer. The end-of-text token stops a row
    in both (nothing after it is scored; NFE to the stop is counted there). With the tasks' 8 shots (prompts cut
    to the model's positions), 64 answer tokens and Fast-dLLM's threshold rule with the dual cache, the tiny
    LLaDA ends its third answer after its first block."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    import mdmkit.evaluation.lm_eval_model  # noqa: F401  (registers model="mdmkit")
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation
    from mdmkit.lm_eval_tasks import utils

    docs, answer = 4, 64
    results = tmp_path / "rows.jsonl"
    cfg = compose_config("evaluate", [
        "task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", f"task.max_gen_len={answer}", f"ckpt={checkpoints['llada']}",
        "hf.kind=llada", f"limit={docs}", f"batch_size={docs}", "device=cpu", f"results_file={results}",
        "wandb.mode=disabled", "sampler=fastdllm_threshold", "sampler.cache=dual"])
    (row,) = run_evaluation(plan_evaluation(cfg))
    assert row["prompts_cut"] == docs  # 8 shots do not fit the tiny model's positions: reported, not silent
    (generations_file,) = (tmp_path / "generations").glob("*.jsonl")
    ours = [json.loads(line) for line in generations_file.read_text().splitlines()]

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)
    utils.task.cache_clear()
    tasks = TaskManager(include_path=str(Path(utils.__file__).parent), include_defaults=False)
    theirs = lm_eval.simple_evaluate(
        model="mdmkit", model_args=f"ckpt={checkpoints['llada']},kind=llada,sampler=fastdllm_threshold,cache=dual",
        gen_kwargs=f"max_gen_toks={answer}", tasks=["mdmkit_gsm8k"], limit=docs, batch_size=docs,
        device="cpu", task_manager=tasks, verbosity="ERROR", log_samples=True)
    samples = sorted(theirs["samples"]["mdmkit_gsm8k"], key=lambda sample: sample["doc_id"])

    ended = [doc for doc in ours if "<|endoftext|>" in doc["raw"]]
    assert ended, "no answer reached the end token: the test would not test the stop"
    for doc in ended:  # stopped at the end token: nothing after it scored, no forward after the stop
        assert "<|endoftext|>" not in doc["generation"] and doc["nfe_to_stop"] == doc["nfe"], doc
    assert [sample["filtered_resps"][0] for sample in samples] == [doc["generation"] for doc in ours]
    assert [sample["accuracy"] for sample in samples] == [float(doc["correct"]) for doc in ours]
    assert [sample["nfe"] for sample in samples] == [doc["nfe"] for doc in ours]
    assert [sample["nfe_to_stop"] for sample in samples] == [doc["nfe_to_stop"] for doc in ours]
    assert row["nfe_mean"] == pytest.approx(theirs["results"]["mdmkit_gsm8k"]["nfe,none"])

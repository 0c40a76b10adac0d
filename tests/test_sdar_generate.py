"""SDAR's own `block_diffusion_generate`, token for token and forward for forward: the `sdar` preset (block
diffusion, its rule filling each block, each full block stored at once) against the 51 runs of the official code in
`../shared/reference_models/sdar/generate.json` (its SOURCE.md): 24 greedy (top_k 1) and 24 seeded temperature-1
runs (TraDo's setting) over low_confidence_dynamic / low_confidence_static / sequential, blocks of 4 and 8, prompts
shorter than, longer than and exactly a block multiple, and 3 runs with a stop token; each row of each run alone.

The reference decodes (and returns) a canvas of whole blocks, the prompt included and still-masked tail blocks left
as masks; the canvas here is the same. It cannot batch (a batch of 2 raises): batched rows here equal their runs
alone. Its seeded runs draw with `torch.multinomial` on the global generator, once per step over the block: mdmkit
makes the same calls on the canvas generator seeded alike, and in a batch given a seed per row, each row's call on
its own generator.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT, compose_config

from mdmkit import api
from mdmkit.core.config import build
from mdmkit.core.errors import ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.samplers import BlockDiffusionSampler, EBSampler, SdarSampler

FIXTURE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models")) / "sdar"
RUNS_FILE = FIXTURE / "generate.json"
pytestmark = [pytest.mark.skipif(not RUNS_FILE.is_file(), reason=f"SDAR's runs not found: {RUNS_FILE}"),
              pytest.mark.usefixtures("one_thread")]
ALL = json.loads(RUNS_FILE.read_text()) if RUNS_FILE.is_file() else {}
RUNS = ALL.get("runs", [])
MASK_ID = 1023


@cache
def network():
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(FIXTURE, "sdar")


def name(run: dict) -> str:
    stop = f"-stop{run['stopping_criteria_idx'][0]}" if run["stopping_criteria_idx"] else ""
    return (f"{run['kind']}-b{run['block_length']}-s{run['denoising_steps']}-{run['remasking_strategy']}"
            f"-{run['confidence_threshold']}-{run['prompt_name']}{stop}")


def preset(run: dict, **rule: object) -> BlockDiffusionSampler:
    """The `sdar` preset with the run's settings."""
    block = run["block_length"]
    sampler = api.sampler("sdar", block_size=block, sub_block=block)
    fields = {"steps": run["denoising_steps"], "strategy": run["remasking_strategy"],
              "threshold": run["confidence_threshold"], "temperature": run["temperature"], "top_k": run["top_k"],
              "top_p": run["top_p"], **rule}
    for key, value in fields.items():
        setattr(sampler.rule, key, value)
    return sampler


def answer_length(prompt: list[int], run: dict) -> int:
    """Masks up to the end of the last block, as the reference's canvas (no cut at gen_length)."""
    block = run["block_length"]
    return -(-(len(prompt) + run["gen_length"]) // block) * block - len(prompt)


def stop_of(run: dict) -> StopCondition | None:
    return None if run["stopping_criteria_idx"] is None else StopCondition.of(run["stopping_criteria_idx"])


@pytest.mark.parametrize("run", RUNS, ids=[name(run) for run in RUNS])
def test_the_sdar_preset_reproduces_its_generate(run: dict) -> None:
    for row, prompt in enumerate(run["prompt"]):
        seed = run["seeds"][row]
        filled = api.fill(network(), [prompt], preset(run), answer_length(prompt, run), MASK_ID,
                          seed=0 if seed is None else seed, stop=stop_of(run))
        assert filled.tokens[0].tolist() == run["sequences"][row]
        assert int(filled.nfe[0]) == run["forward_calls"][row]


def test_the_runs_cover_what_the_issue_lists() -> None:
    kinds = [run["kind"] for run in RUNS]
    assert (kinds.count("greedy_topk1"), kinds.count("sampled_t1"), kinds.count("greedy_topk1_stop")) == (24, 24, 3)
    assert {run["remasking_strategy"] for run in RUNS} == {"low_confidence_dynamic", "low_confidence_static",
                                                           "sequential"}
    assert {run["block_length"] for run in RUNS} == {4, 8}
    # a stopped run returns whole canvas, tail blocks still masked (the stop is read after a stored block)
    stopped = [run for run in RUNS if run["stopping_criteria_idx"]]
    assert all(MASK_ID in run["sequences"][0] for run in stopped)


# every third greedy run (each strategy, both blocks) and the stop runs
BATCHED = [run for run in RUNS if run["kind"] == "greedy_topk1"][::3] + \
    [run for run in RUNS if run["kind"] == "greedy_topk1_stop"]


@pytest.mark.parametrize("run", BATCHED, ids=[name(run) for run in BATCHED])
def test_batched_rows_equal_their_runs_alone(run: dict) -> None:
    # every prompt of the fixture in one left-padded batch (lengths 6, 13 and 8: their blocks start at their own
    # first token), one answer length: each row is what it gives alone, tokens and forwards
    prompts = [p for r in RUNS if r["kind"] == "greedy_topk1" and r["block_length"] == 4
               and r["remasking_strategy"] == "sequential" for p in r["prompt"]]
    assert len(prompts) == 6
    length = answer_length(run["prompt"][0], run)
    batched = api.fill(network(), prompts, preset(run), length, MASK_ID, stop=stop_of(run))
    for row, prompt in enumerate(prompts):
        alone = api.fill(network(), [prompt], preset(run), length, MASK_ID, stop=stop_of(run))
        tokens = batched.tokens[row, batched.tokens.shape[1] - len(prompt) - length:]
        assert tokens.tolist() == alone.tokens[0].tolist()
        assert int(batched.nfe[row]) == int(alone.nfe[0])


def setting(run: dict) -> tuple:
    return (run["kind"], run["block_length"], run["denoising_steps"], run["remasking_strategy"],
            run["confidence_threshold"])


# seeded (temperature 1) settings: TraDo's (dynamic at 0.9, blocks of 4), static and sequential in blocks of 8
SEEDED = [run for run in RUNS if run["prompt_name"] == "long13" and setting(run)[1:] in
          {(4, 4, "low_confidence_dynamic", 0.9), (8, 8, "low_confidence_static", 0.85), (8, 4, "sequential", 0.85)}
          and run["kind"] == "sampled_t1"]


@pytest.mark.parametrize("run", SEEDED, ids=[name(run) for run in SEEDED])
def test_batched_seeded_rows_equal_their_runs_alone(run: dict) -> None:
    # the setting's six prompts (lengths 6, 13 and 8) in one left-padded batch, each row with its fixture seed and
    # its own generator: each row is its run alone, and the rows of the reference's length are its sequences
    same = [r for r in RUNS if setting(r) == setting(run)]
    assert len(same) == 3
    prompts = [p for r in same for p in r["prompt"]]
    seeds = [s for r in same for s in r["seeds"]]
    expected = [(seq, calls) for r in same for seq, calls in zip(r["sequences"], r["forward_calls"])]
    length = answer_length(run["prompt"][0], run)
    batched = api.fill(network(), prompts, preset(run), length, MASK_ID, seed=seeds)
    for row, prompt in enumerate(prompts):
        tokens = batched.tokens[row, batched.tokens.shape[1] - len(prompt) - length:].tolist()
        alone = api.fill(network(), [prompt], preset(run), length, MASK_ID, seed=seeds[row])
        assert tokens == alone.tokens[0].tolist()
        assert int(batched.nfe[row]) == int(alone.nfe[0])
        if len(prompt) == len(run["prompt"][0]):
            assert (tokens, int(batched.nfe[row])) == tuple(expected[row])
    # one generator shared by the rows splits its stream between them: a row's draws are not its run's
    shared = api.fill(network(), run["prompt"], preset(run), length, MASK_ID, seed=run["seeds"][0])
    assert shared.tokens.tolist() != run["sequences"]


def test_overwrite_false_writes_masked_positions_only() -> None:
    # where a step's count exceeds the masks left, the reference's topk picks given positions too and writes its
    # fresh draws there (this run depends on it); overwrite=false keeps every decided token
    run = next(r for r in RUNS if r["kind"] == "greedy_topk1" and r["block_length"] == 8
               and r["confidence_threshold"] == 1.0 and r["prompt_name"] == "long13")
    prompt = run["prompt"][0]
    sampler = preset(run, overwrite=False)
    filled = api.fill(network(), [prompt], sampler, answer_length(prompt, run), MASK_ID)
    assert filled.tokens[0].tolist() != run["sequences"][0]
    assert MASK_ID not in filled.tokens[0].tolist() and filled.tokens[0, : len(prompt)].tolist() == prompt


def test_temperature_zero_is_the_argmax_where_the_reference_raises() -> None:
    # the reference divides by 0 and its draw raises; here 0 takes the argmax, the token top_k=1 draws: sequential
    # reveals by position, so its runs come back unchanged
    assert "probability tensor contains" in ALL["observed_errors"]["temperature_0"]
    for run in (r for r in RUNS if r["kind"] == "greedy_topk1" and r["remasking_strategy"] == "sequential"):
        prompt = run["prompt"][0]
        filled = api.fill(network(), [prompt], preset(run, temperature=0.0, top_k=0), answer_length(prompt, run),
                          MASK_ID)
        assert filled.tokens[0].tolist() == run["sequences"][0]


def test_entropy_bounded_works_where_the_reference_raises() -> None:
    assert "UnboundLocalError" in ALL["observed_errors"]["entropy_bounded"]
    prompt = RUNS[0]["prompt"][0]  # 6 tokens; blocks of 4: a prefill, then 5 blocks (the first holds 2 masks)

    def fill(bound: float) -> api.Filled:
        sampler = api.sampler("sdar")
        sampler.rule.strategy, sampler.rule.eb_threshold, sampler.rule.temperature = "entropy_bounded", bound, 0.0
        return api.fill(network(), [prompt], sampler, 18, MASK_ID)

    loose, tight = fill(1e9), fill(1e-9)
    assert MASK_ID not in loose.tokens[0].tolist() and MASK_ID not in tight.tokens[0].tolist()
    # a loose bound reveals a whole block a step (prefill + 5 x (1 step + its store)); a tight one a token a step
    assert int(loose.nfe[0]) == 1 + 5 * 2
    assert int(tight.nfe[0]) == 1 + (2 + 1) + 4 * (4 + 1)


def test_any_masked_rule_fills_its_blocks() -> None:
    # mdmkit's EB rule inside SDAR's blocks, each full block stored at once (block diffusion with the preset's block
    # settings: the preset's own rule is SDAR's, from another config group)
    cfg = compose_config("evaluate", ["sampler=block_diffusion", "sampler.block_size=4", "sampler.sub_block=4",
                                      "sampler.commit_reveals=false", "sampler.store_finished=true",
                                      "sampler@sampler.rule=eb", "sampler.rule.gamma=0.5"])
    sampler = build(cfg.sampler, "sampler")
    assert isinstance(sampler, BlockDiffusionSampler) and isinstance(sampler.rule, EBSampler)
    assert sampler.store_finished and not sampler.commit_reveals
    prompts = [run["prompt"][0] for run in RUNS[:3]]
    filled = api.fill(network(), prompts, sampler, 18, MASK_ID)
    assert MASK_ID not in filled.tokens.tolist()
    for row, prompt in enumerate(prompts):  # batched equals alone here too
        alone = api.fill(network(), [prompt], sampler, 18, MASK_ID)
        assert filled.tokens[row, -len(prompt) - 18:].tolist() == alone.tokens[0].tolist()
        assert int(filled.nfe[row]) == int(alone.nfe[0])


def test_what_the_rule_refuses_is_one_line() -> None:
    def rule(**fields: object) -> object:
        return build({"_target_": "mdmkit.samplers.SdarSampler", **fields}, "sampler.rule")

    with pytest.raises(ConfigError, match="strategy='low_confidence': expected one of 'low_confidence_dyn") as caught:
        rule(strategy="low_confidence")
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="steps=0 must be >= 1"):
        rule(steps=0)
    with pytest.raises(ConfigError, match="3 seeds for 2 prompts: one seed, or one per prompt"):
        api.fill(network(), [[1, 2], [3]], api.sampler("sdar"), 4, MASK_ID, seed=[1, 2, 3])
    with pytest.raises(ConfigError, match="store_finished .* needs commit_reveals=false"):
        BlockDiffusionSampler(block_size=4, sub_block=4, rule=SdarSampler(), store_finished=True)

"""Fast-dLLM v2's own `generate`, token for token: the `fast_dllm_v2` preset (BlockDiffusionSampler) against the 52
runs of the hub remote code in `../shared/reference_models/fast_dllm_v2/generate.json` (its SOURCE.md), through the
Python API, on the tiny fixture.

Each run's two prompts are decoded per row (batch 1) and as one batch of 2. mdmkit keeps the rows of a batch
independent, so every row here equals its per-row run. The reference couples them: its stop test reads the first
row that has the stop token, cuts every row at that column, and its sub-block cache refreshes when any row needs it;
`COUPLED` lists where that makes its batched rows differ from its per-row runs (docs/samplers.md).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from mdmkit import api
from mdmkit.core.stopping import StopCondition

FIXTURE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models")) / "fast_dllm_v2"
RUNS_FILE = FIXTURE / "generate.json"
pytestmark = [pytest.mark.skipif(not RUNS_FILE.is_file(), reason=f"Fast-dLLM v2's runs not found: {RUNS_FILE}"),
              pytest.mark.usefixtures("one_thread")]
RUNS = json.loads(RUNS_FILE.read_text()) if RUNS_FILE.is_file() else []
MASK_ID = 1023
SETTINGS = ("block_size", "small_block_size", "threshold", "use_block_cache", "prompt_name", "stop_token")
# (block, sub-block, threshold, block cache, prompts, stop token) -> the rows whose batched reference output is not
# their per-row output: "cache" where its sub-block cache refreshes for all rows at once, "cut" where the row is
# cut at the other row's stop column
COUPLED = {
    (32, 8, 0.9, True, "short13", 1000): {0: "cache", 1: "cache"},
    (32, 8, 0.9, True, "long45", 1000): {0: "cache", 1: "cache"},
    (32, 8, 0.5, True, "short13", 1000): {1: "cache"},
    (32, 8, 0.5, True, "long45", 1000): {0: "cache", 1: "cache"},
    (16, 4, 0.5, False, "exact32", 1000): {0: "cut"},
    (16, 4, 0.5, True, "short13", 1000): {0: "cache"},
    (16, 4, 0.5, True, "long45", 1000): {1: "cache"},
    (16, 4, 0.5, True, "exact32", 1000): {0: "cache"},
    (32, 8, 0.5, False, "short13", 637): {1: "cut"},
}


def name(run: dict) -> str:
    return "-".join(str(run[key]) for key in SETTINGS) + ("-batched" if run["batched"] else "")


@cache
def network():
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(FIXTURE, "fast_dllm_v2", mask_id=MASK_ID)


def answer_length(prompt: int, block: int, max_new_tokens: int) -> int:
    """How many tokens the reference appends: max_new_tokens // block blocks, each filled to the block's end and
    followed by the token its completing forward predicts (and one more after a prompt of whole blocks longer than
    one block)."""
    length = prompt + (prompt > block and prompt % block == 0)
    for _ in range(max_new_tokens // block):
        length += block - length % block + 1
    return length - prompt


def decode(run: dict, prompts: list[list[int]]) -> tuple[list[list[int]], api.Filled]:
    """mdmkit's outputs for `prompts`, each cut after its first stop token as the reference cuts them."""
    sampler = api.sampler("fast_dllm_v2", block_size=run["block_size"], sub_block=run["small_block_size"],
                          block_cache=run["use_block_cache"])
    sampler.rule.tau = run["threshold"]
    assert run["temperature"] == 0 and run["mask_id"] == MASK_ID
    length = answer_length(len(prompts[0]), run["block_size"], run["max_new_tokens"])
    filled = api.fill(network(), prompts, sampler, length, MASK_ID, stop=StopCondition.of([run["stop_token"]]))
    outputs = []
    for prompt, tokens in zip(prompts, filled.tokens.tolist()):
        answer = tokens[len(prompt):]
        cut = answer.index(run["stop_token"]) + 1 if run["stop_token"] in answer else len(answer)
        assert MASK_ID not in answer[:cut]
        outputs.append(prompt + answer[:cut])
    return outputs, filled


def per_row_runs() -> dict[tuple, dict]:
    return {tuple(run[key] for key in SETTINGS): run for run in RUNS if not run["batched"]}


@pytest.mark.parametrize("run", [run for run in RUNS if not run["batched"]], ids=name)
def test_the_preset_reproduces_generate_per_row(run: dict) -> None:
    for prompt, expected in zip(run["prompt"], run["sequences"]):
        (output,), filled = decode(run, [prompt])
        assert output == expected[0]
        if run["threshold"] == 1.0:  # one token a forward, but for a prefill that ends inside the prompt's block
            block = run["block_size"]
            prefill_only = len(prompt) > block and len(prompt) % block != 0
            assert int(filled.nfe[0]) == len(output) - len(prompt) + prefill_only
        assert int(filled.nfe_to_stop[0]) <= int(filled.nfe[0])


@pytest.mark.parametrize("run", [run for run in RUNS if run["batched"]], ids=name)
def test_batched_rows_are_decoded_as_alone(run: dict) -> None:
    setting = tuple(run[key] for key in SETTINGS)
    alone = per_row_runs()[setting]["sequences"]
    outputs, _ = decode(run, run["prompt"])
    (reference,) = run["sequences"] if len(run["sequences"]) == 1 else [[seq[0] for seq in run["sequences"]]]
    coupled = {}
    for row, output in enumerate(outputs):
        assert output == alone[row][0]
        if reference[row] == alone[row][0]:
            continue
        # the reference's batch coupling: its row was cut at the other row's stop column, or decoded otherwise
        coupled[row] = "cut" if alone[row][0][: len(reference[row])] == reference[row] else "cache"
    assert coupled == COUPLED.get(setting, {})


def test_every_forward_is_a_step_of_the_rows_it_ran_on() -> None:
    run = per_row_runs()[(32, 8, 0.5, True, "long45", 1000)]
    sampler = api.sampler("fast_dllm_v2", block_cache=True)
    sampler.rule.tau = 0.5
    prompts = torch.tensor(run["prompt"])
    tokens = torch.cat([prompts, torch.full((2, 52), MASK_ID)], 1)
    from mdmkit.samplers import ForwardCounter

    counter = ForwardCounter(network(), 2)
    sampled = sampler.sample(counter, tokens, MASK_ID)
    assert counter.nfe.tolist() == sampled.steps.tolist()
    assert (sampled.tokens != MASK_ID).all()
    # the block cache's sub-block steps run fewer tokens than a forward over the whole block
    assert (counter.tokens < counter.nfe * 32).all()

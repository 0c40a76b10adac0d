"""Fast-dLLM v2's own `generate`, token for token: the `fast_dllm_v2` preset (BlockDiffusionSampler) against the 52
runs of the hub remote code in `../shared/reference_models/fast_dllm_v2/generate.json` (its SOURCE.md), through the
Python API, on the tiny fixture.

Each run's two prompts are decoded per row (batch 1) and as one batch of 2. mdmkit keeps the rows of a batch
independent, so every row here equals its per-row run. The reference couples them: its stop test reads the first
row that has the stop token, cuts every row at that column, and its sub-block cache refreshes when any row needs it;
`COUPLED` lists where that makes its batched rows differ from its per-row runs (docs/samplers.md). Blocks larger
than 32, which the runs do not have, are checked against a re-statement of its generate: its block steps attend in
blocks of 32 (`attention_block: 32`).
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


def prompt_of(name: str) -> list[int]:
    """The runs' prompts (short13, long45, exact32) and two made of them: 64 tokens (exactly a block of 64) and 90
    (longer than a block of 64, not a multiple)."""
    rows = {run["prompt_name"]: run["prompt"] for run in RUNS}
    made = {"exact64": rows["exact32"][0] + rows["exact32"][1], "long90": rows["long45"][0] + rows["long45"][1]}
    return made[name] if name in made else rows[name][0]


@torch.no_grad()
def official_generate(prompt: list[int], max_new_tokens: int, block: int, small: int, tau: float,
                      group: int | None) -> list[int]:
    """Fast-dLLM v2's generate written out (hub modeling.py; one row, temperature 0, no stop token, no block cache).
    Its cached forwards are recomputed over the cached tokens and the current block at positions from 0: the cache
    block-causal in blocks of `block` (its prefill and committing forwards pass block_size), the block's queries
    seeing the whole cache and, inside the block, block-causally in blocks of `group` (its block steps pass no
    block_size: its forward's default, 32; None: the whole block). A step reads the sub-block's shifted logits, takes
    the argmax, and reveals the masked positions above tau and the most confident one; a finished block is cached
    and its last output's argmax appended. Returns the prompt and the tokens appended."""
    from mdmkit.models.llm.diffusion_lm import block_causal_mask

    def run(tokens: list[int], mask: torch.Tensor) -> torch.Tensor:
        return network()(torch.tensor([tokens]), mask[None, None])[0]

    def committed(past: list[int], current: list[int]) -> int:
        """The argmax of the last output of a forward that caches `current` (a query slot after it reads it)."""
        positions = torch.arange(len(past) + len(current) + 1)[None]
        return int(run(past + current + [MASK_ID], block_causal_mask(positions, positions, block)[0, 0])[-1].argmax())

    x, past = list(prompt), []
    if len(x) > block:
        past = x[: len(x) // block * block]
        if len(x) % block == 0:
            x.append(committed(past[:-block], past[-block:]))
    for _ in range(max_new_tokens // block):
        x += [MASK_ID] * (block - len(x) % block)
        n = len(past)
        positions = torch.arange(n + block)
        mask = block_causal_mask(positions[None], positions[None], block)[0, 0]
        if group is not None:
            mask[n:, n:] = positions[n:, None] // group >= positions[None, n:] // group
        else:
            mask[n:, n:] = True
        for start in range(0, block, small):
            while MASK_ID in x[len(x) - block + start: len(x) - block + start + small]:
                current = x[-block:]
                assert n == 0 or current[0] != MASK_ID  # so the shift's first position needs no special case
                probs = run(past + current, mask)[n + start: n + start + small].softmax(-1)
                confidence, token = probs.max(-1)
                masked = torch.tensor(current[start: start + small]) == MASK_ID
                confidence = torch.where(masked, confidence, float("-inf"))
                reveal = confidence > tau
                reveal[confidence.argmax()] = True
                for i in (reveal & masked).nonzero()[:, 0].tolist():
                    x[len(x) - block + start + i] = int(token[i])
        current = x[-block:]
        x.append(committed(past, current))
        past = past + current
    return x


LARGE_BLOCKS = [(64, 8, 0.9, "short13"), (64, 8, 0.5, "long45"), (64, 16, 0.5, "long90"), (64, 8, 0.5, "exact64"),
                (48, 16, 0.5, "long45"), (16, 4, 0.5, "short13")]  # block, sub-block, threshold, prompt


@pytest.mark.parametrize("block, small, tau, prompt_name", LARGE_BLOCKS,
                         ids=["-".join(map(str, setting)) for setting in LARGE_BLOCKS])
def test_blocks_other_than_32_attend_as_its_block_steps_do(block: int, small: int, tau: float,
                                                          prompt_name: str) -> None:
    # the preset (attention_block 32) equals its generate at any block size; attention_block null equals that
    # generate with every position of a block seeing the whole block, which differs where the block exceeds 32
    prompt, max_new_tokens = prompt_of(prompt_name), 2 * block
    outputs = {}
    for group in (32, None):
        sampler = api.sampler("fast_dllm_v2", block_size=block, sub_block=small, attention_block=group)
        sampler.rule.tau = tau
        length = answer_length(len(prompt), block, max_new_tokens)
        outputs[group] = api.fill(network(), [prompt], sampler, length, MASK_ID).tokens[0].tolist()
        assert outputs[group] == official_generate(prompt, max_new_tokens, block, small, tau, group)
    assert (outputs[32] == outputs[None]) == (32 % block == 0)


@pytest.mark.parametrize("block_cache", [False, True], ids=["exact", "sub-block-cache"])
def test_a_block_steps_mask_is_its_forwards_own(block_cache: bool) -> None:
    # every forward over a whole block of 64 that fills it attends as its forward's eval_mask builds it with the
    # default block_size 32 after the cached prefix: query q sees key k when q // 32 >= k // 32, positions from 0;
    # the sub-block cache's steps attend to everything cached, as its forward without a mask does
    net, masks, unmasked = network(), [], []
    plain = net.forward

    def spy(tokens: torch.Tensor, attn_mask: torch.Tensor, **kwargs: object) -> torch.Tensor:
        cache = kwargs["cache"]
        if cache.splice:
            unmasked.append(attn_mask)
        elif tokens.shape[1] == 64:  # a commit's forward has one query slot more than the columns it writes
            masks.append((cache.read, attn_mask))
        return plain(tokens, attn_mask, **kwargs)

    net.forward = spy
    try:
        for prompt_name in ("short13", "long90"):
            sampler = api.sampler("fast_dllm_v2", block_size=64, sub_block=8, block_cache=block_cache)
            prompt = prompt_of(prompt_name)
            api.fill(net, [prompt], sampler, answer_length(len(prompt), 64, 64), MASK_ID)  # its whole blocks
    finally:
        del net.forward
    assert {read for read, _ in masks} == {0, 64}
    for read, mask in masks:
        queries, keys = torch.arange(64) + read, torch.arange(64 + read)
        assert torch.equal(mask[0, 0], queries[:, None] // 32 >= keys[None, :] // 32)
    assert bool(unmasked) == block_cache and all(bool(mask.all()) for mask in unmasked)

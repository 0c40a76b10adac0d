"""LLaDA2.0's own `generate`, token for token: the `llada2` preset (block diffusion, its rule filling each block)
against the 20 float32 runs of the hub remote code in `../shared/reference_models/llada2_mini/generate.json` (its
SOURCE.md), through the Python API, on the tiny fixture: greedy (top_k 1) and seeded sampling (temperature 0 and 0.5,
top_p 0.9), blocks of 32, 16 and 8, prompts shorter and longer than a block; and its 4 bfloat16 runs (the model cast
with `.to(torch.bfloat16)`, as its model card runs it, which rounds the rotary frequencies to bfloat16 too).

The reference decodes a canvas of whole blocks (the prompt, then masks up to the end of the last block) and returns
the answer up to its first eos (or, when `eos_early_stop` settles it, the prompt and the answer up to it); the
canvas here is the same, and the output is cut the same way. Its seeded runs draw with `torch.multinomial` on the
global generator: mdmkit draws the same calls from the canvas generator seeded alike. Their mask token is never
drawn; a network that makes it likely checks the draw against a re-statement of the reference (it can draw the mask
token, which leaves the position masked) and `mask_never_drawn` against the same with the mask token's weight zeroed.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from conftest import reference_network, reference_runs

from mdmkit import api
from mdmkit.core.errors import CapabilityError, ConfigError

FIXTURE, ALL_RUNS, pytestmark = reference_runs("llada2_mini", "LLaDA2.0")
RUNS = ALL_RUNS.get("float32_mask_shim", [])
BFLOAT16_RUNS = ALL_RUNS.get("bfloat16_unmodified", [])
MASK_ID = 1023


def network(dtype: torch.dtype = torch.float32):
    return reference_network("llada2_mini", "llada2", MASK_ID, dtype)


def name(run: dict) -> str:
    return (f"b{run['block_length']}-s{run['steps']}-g{run['gen_length']}-t{run['temperature']}-k{run['top_k']}"
            f"-p{run.get('top_p')}-{run['prompt_name']}-eos{run['eos_id']}{'-early' if run['eos_early_stop'] else ''}")


def preset(run: dict):
    """The `llada2` preset with the run's settings (the hub's temperature 0 draws from the untempered softmax)."""
    block = run["block_length"]
    sampler = api.sampler("llada2", block_size=block, sub_block=block)
    rule = sampler.rule
    rule.steps = min(run["steps"], run["gen_length"] // run.get("minimal_topk", 1))  # its default 1
    rule.tau, rule.top_k, rule.top_p = run["threshold"], run["top_k"] or 0, run.get("top_p") or 1.0
    rule.temperature = run["temperature"] or 1.0
    return sampler


def reference_cut(run: dict, canvas: list[int]) -> list[int]:
    """What the reference returns from the decoded canvas: the answer to its first eos, or, where eos_early_stop
    settled it (no mask left before it), the prompt and the answer to its first eos."""
    prompt, eos = len(run["prompt"][0]), run["eos_id"]
    answer = canvas[prompt: prompt + run["gen_length"]]
    first = answer.index(eos) if eos in answer else None
    if first is None:
        return answer
    early = run["eos_early_stop"] and len(run["sequences"][0]) == prompt + first + 1
    return canvas[: prompt + first + 1] if early else answer[: first + 1]


@pytest.mark.parametrize("dtype, run", [(torch.float32, run) for run in RUNS] +
                         [(torch.bfloat16, run) for run in BFLOAT16_RUNS],
                         ids=[name(run) for run in RUNS] + [f"bfloat16-{name(run)}" for run in BFLOAT16_RUNS])
def test_the_llada2_preset_reproduces_its_generate(dtype: torch.dtype, run: dict) -> None:
    prompt = run["prompt"][0]
    block = run["block_length"]
    canvas_end = -(-(len(prompt) + run["gen_length"]) // block) * block  # whole blocks, as the reference's canvas
    filled = api.fill(network(dtype), [prompt], preset(run), canvas_end - len(prompt), MASK_ID, seed=run["seed"] or 0)
    canvas = filled.tokens[0].tolist()
    assert MASK_ID not in canvas
    assert reference_cut(run, canvas) == run["sequences"][0]


@cache
def mask_heavy_network():
    """The fixture network with its mask token's logit raised so that it takes 0.18 of every softmax (the fixture
    gives it at most 0.03, so its recorded runs never draw it)."""
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    net = load_diffusion_lm(FIXTURE, "llada2", mask_id=MASK_ID)
    plain = net.forward

    def forward(*args: object, **kwargs: object) -> torch.Tensor:
        logits = plain(*args, **kwargs)
        others = logits.index_fill(-1, torch.tensor([MASK_ID]), float("-inf")).logsumexp(-1)
        logits[..., MASK_ID] = others - 1.5  # p(mask) = 1 / (1 + e^1.5) = 0.18
        return logits

    net.forward = forward
    return net


@torch.no_grad()
def official_canvas(prompt: list[int], block: int, steps: int, gen_length: int, tau: float, seed: int,
                    zero_mask: bool) -> list[int]:
    """LLaDA2.0's generate written out (hub modeling_llada2_moe.py; one prompt, no eos): each step a forward over
    every block so far (block-causal mask, positions from 0), then one `torch.multinomial` over the block's softmax
    (with `zero_mask`, the mask token's weight zeroed first: mdmkit's `mask_never_drawn`), the confidence of the
    drawn token, the threshold or the schedule's count of the most confident, and the drawn tokens written, the mask
    token too. A block's steps end at `steps`; what they leave masked stays masked. The whole canvas is returned."""
    from mdmkit.models.llm.diffusion_lm import block_causal_mask

    generator = torch.Generator().manual_seed(seed)
    blocks = -(-(len(prompt) + gen_length) // block)
    x = torch.full((1, blocks * block), MASK_ID)
    x[0, : len(prompt)] = torch.tensor(prompt)
    counts = [block // steps + (i < block % steps) for i in range(steps)]
    for index in range(len(prompt) // block, blocks):
        end = (index + 1) * block
        positions = torch.arange(end)[None]
        for step in range(steps):
            current = x[0, end - block: end]  # a view: writes go to x
            masked = current == MASK_ID
            if not masked.any():
                break
            probs = mask_heavy_network()(x[:, :end], block_causal_mask(positions, positions, block))[0, -block:]
            probs = probs.softmax(-1)
            weights = probs.clone()
            if zero_mask:
                weights[:, MASK_ID] = 0.0
            token = torch.multinomial(weights, 1, generator=generator)[:, 0]
            confidence = torch.where(masked, probs.gather(-1, token[:, None])[:, 0], float("-inf"))
            chosen = confidence > tau
            if int(chosen.sum()) < counts[step]:
                chosen = torch.zeros_like(masked)
                chosen[confidence.topk(min(counts[step], int(masked.sum()))).indices] = True
            current[chosen] = token[chosen]
    return x[0].tolist()


MASK_HEAVY = [(16, 16, 48, 0.95), (8, 4, 32, 0.5), (32, 8, 40, 0.9)]  # block, steps, gen_length, tau


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("prompt_name", ["short10", "long37"])
@pytest.mark.parametrize("block, steps, gen_length, tau", MASK_HEAVY, ids=[f"b{s[0]}-s{s[1]}" for s in MASK_HEAVY])
def test_the_draw_picks_the_mask_token_as_the_reference_does_unless_told_not_to(
        block: int, steps: int, gen_length: int, tau: float, prompt_name: str, seed: int) -> None:
    # by default the draw reads the whole softmax, as the reference's: a position that draws the mask token and is
    # chosen is written with it and stays masked, and one still masked after the block's steps is left in the canvas;
    # `mask_never_drawn` is the reference with the mask token's weight zeroed (mdmkit's behaviour before)
    prompt = next(run["prompt"][0] for run in RUNS if run["prompt_name"] == prompt_name)
    canvas_end = -(-(len(prompt) + gen_length) // block) * block
    canvases = {}
    for never in (False, True):
        sampler = api.sampler("llada2", block_size=block, sub_block=block)
        sampler.rule.steps, sampler.rule.tau, sampler.rule.temperature = steps, tau, 1.0
        sampler.rule.mask_never_drawn = never
        filled = api.fill(mask_heavy_network(), [prompt], sampler, canvas_end - len(prompt), MASK_ID, seed=seed)
        canvases[never] = filled.tokens[0].tolist()
        assert canvases[never] == official_canvas(prompt, block, steps, gen_length, tau, seed, zero_mask=never)
    assert MASK_ID not in canvases[True][len(prompt):]
    assert canvases[False] != canvases[True]


def test_a_mask_left_in_a_block_stays_and_the_next_blocks_are_decoded() -> None:
    # the reference moves on from a block whose steps ran out with the mask token drawn last: so does the walk
    prompt = RUNS[0]["prompt"][0]
    canvas = official_canvas(prompt, 8, 4, 32, 0.5, 0, zero_mask=False)
    answer = canvas[len(prompt):]
    last_block = len(canvas) - 8 - len(prompt)
    assert MASK_ID in answer[:last_block] and set(answer[last_block:]) != {MASK_ID}  # left, and decoding went on
    sampler = api.sampler("llada2", block_size=8, sub_block=8)
    sampler.rule.steps, sampler.rule.tau, sampler.rule.temperature = 4, 0.5, 1.0
    filled = api.fill(mask_heavy_network(), [prompt], sampler, len(canvas) - len(prompt), MASK_ID)
    assert filled.tokens[0].tolist() == canvas


def test_the_runs_cover_greedy_and_seeded_sampling_with_both_return_formats() -> None:
    assert len(RUNS) == 20 and len(BFLOAT16_RUNS) == 4
    assert {run["top_k"] for run in RUNS} == {1, None} and {run["temperature"] for run in RUNS} == {0.0, 0.5}
    # eos_early_stop returns the prompt with the answer; the other format is the answer alone
    assert any(len(run["sequences"][0]) == 49 and run["prompt_name"] == "long37" for run in RUNS)


def test_each_block_costs_its_steps_and_one_committing_forward() -> None:
    # greedy top-1 scores every drawn token 1.0 > 0.95: each block fills in one step; the committing forward of a
    # finished block (exact cache) reveals nothing here, unlike Fast-dLLM v2's
    run = RUNS[0]
    assert (run["top_k"], run["block_length"], len(run["prompt"][0])) == (1, 32, 10)
    filled = api.fill(network(), run["prompt"], preset(run), 54, MASK_ID)
    assert filled.nfe.tolist() == [3]  # block 0, commit block 0, block 1


def test_the_rule_refuses_what_it_does_not_compute() -> None:
    from mdmkit.core.config import build

    def rule(**fields: object) -> object:
        return build({"_target_": "mdmkit.samplers.Llada2Sampler", **fields}, "sampler.rule")

    # its scores always read the softmax with the mask token, it ranks by confidence, and it fills one block of
    # block diffusion (no blocks or caches of its own): none of these is a knob of its config
    for knob in ({"mask_in_softmax": False}, {"ordering": "entropy"}, {"block_length": 8}, {"cache": "prefix"}):
        with pytest.raises(ConfigError, match=f"unknown key '{next(iter(knob))}'"):
            rule(**knob)
    with pytest.raises(ConfigError, match="top_k=-1 must be >= 0"):
        rule(top_k=-1)


@torch.no_grad()
def test_bfloat16_rounds_the_rotary_frequencies_as_its_model_card_does() -> None:
    # the card casts the loaded model with .to(torch.bfloat16), which rounds its rotary frequency buffer too; the
    # network does the same in bfloat16 (without it, the bfloat16 runs part from the reference after a few tokens),
    # and nothing in float32
    from mdmkit.models.llm.diffusion_lm import rotary_angles

    half = network(torch.bfloat16)
    assert half.config.rotary_freqs_rounded
    positions = torch.arange(64)[None]
    exact, _ = rotary_angles(positions, 8, half.config.rope_theta)
    rounded, _ = rotary_angles(positions, 8, half.config.rope_theta, torch.bfloat16)
    assert not torch.equal(exact, rounded)
    assert torch.equal(rotary_angles(positions, 8, half.config.rope_theta, torch.float32)[0], exact)


def test_block_diffusion_refuses_a_bidirectional_moe_network() -> None:
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    llada_moe = load_diffusion_lm(FIXTURE.parent / "llada_moe", "llada_moe")
    with pytest.raises(CapabilityError, match="block-causal"):
        api.fill(llada_moe, [[5, 6, 7]], api.sampler("llada2"), 8, MASK_ID)

"""Block diffusion (`sampler=block_diffusion`) with every budget rule inside a block, on the tiny Fast-dLLM v2 fixture.

Each masked-loop sampler fills the sub-blocks: every masked position is filled, every forward is charged to the
rows it ran on (one step each), and a batch of left-padded prompts of different lengths decodes each row as it
decodes alone (blocks count from each row's first real token; rows share no decision). What cannot run inside a
block is refused in one line.
"""

from __future__ import annotations

import dataclasses
import os
from functools import cache
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from hydra.utils import get_class

from mdmkit import api
from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import BlockDiffusionSampler, ForwardCounter, MaskedSampler, ThresholdSampler

FIXTURE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models")) / "fast_dllm_v2"
pytestmark = [pytest.mark.skipif(not (FIXTURE / "model.safetensors").is_file(),
                                 reason=f"Fast-dLLM v2 reference fixture not found: {FIXTURE}"),
              pytest.mark.usefixtures("one_thread")]
MASK_ID = 1023
SAMPLER_OPTIONS = sorted(path.stem for path in (ROOT / "conf" / "sampler").glob("*.yaml"))
RULES = [name for name in SAMPLER_OPTIONS if issubclass(get_class(option("sampler", name)["_target_"]), MaskedSampler)]
RANDOM = {"dream_origin"}  # draws from the generator: a batch and its rows alone draw differently
PROMPTS = [[5, 17, 230, 41, 99, 7, 310, 12, 600], [8, 3], list(range(40, 61))]  # 9, 2 and 21 tokens


@cache
def network():
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(FIXTURE, "fast_dllm_v2", mask_id=MASK_ID)


def block_sampler(rule_name: str, **fields) -> BlockDiffusionSampler:
    rule = dataclasses.replace(build(option("sampler", rule_name), "sampler"), block_length=None, cache="none")
    if hasattr(rule, "steps") and rule.steps is not None:
        rule = dataclasses.replace(rule, steps=4)  # a schedule over the sub-block
    return BlockDiffusionSampler(block_size=16, sub_block=8, rule=rule, **fields)


def test_the_rules_are_every_masked_loop_sampler() -> None:
    assert {"topk", "eb", "threshold", "factor", "fastdllm_factor", "klass", "credit", "steps", "llada", "all",
            "dream_entropy", "dream_origin"} <= set(RULES)


@pytest.mark.parametrize("block_cache", [False, True], ids=["exact", "sub-block-cache"])
@pytest.mark.parametrize("rule_name", RULES)
def test_every_rule_fills_every_block_with_nfe_per_row(rule_name: str, block_cache: bool) -> None:
    sampler = block_sampler(rule_name, block_cache=block_cache)
    batch = api.fill(network(), PROMPTS, sampler, 20, MASK_ID, seed=3)
    assert (batch.tokens != MASK_ID).all()
    assert (batch.nfe >= 2).all()  # a block of 16 over 20 answer tokens: at least one forward per block
    for row, prompt in enumerate(PROMPTS):
        alone = api.fill(network(), [prompt], sampler, 20, MASK_ID, seed=3)
        assert int(alone.nfe[0]) >= 2
        if rule_name not in RANDOM:
            assert batch.tokens[row, -len(prompt) - 20:].tolist() == alone.tokens[0].tolist()
            assert int(batch.nfe[row]) == int(alone.nfe[0])


@pytest.mark.parametrize("block_cache", [False, True], ids=["exact", "sub-block-cache"])
def test_a_stop_token_ends_a_row_where_its_text_is_settled(block_cache: bool) -> None:
    # the canvas ends inside a sub-block (9 + 20 tokens, blocks of 16, sub-blocks of 8): the stop is read on
    # the whole canvas with the sub-block's current state, and the row ends there, no forward after it
    from mdmkit.core.stopping import StopCondition

    sampler = block_sampler("threshold", block_cache=block_cache)
    free = api.fill(network(), PROMPTS[:1], sampler, 20, MASK_ID)
    answer = free.tokens[0, len(PROMPTS[0]):].tolist()
    stop_token = answer[-2]  # the position before the canvas's last, in its last (short) sub-block
    cut = answer.index(stop_token) + 1
    stopped = api.fill(network(), PROMPTS[:1], sampler, 20, MASK_ID, stop=StopCondition.of([stop_token]))
    assert stopped.tokens[0, len(PROMPTS[0]):][:cut].tolist() == answer[:cut]
    assert int(stopped.nfe[0]) == int(stopped.nfe_to_stop[0]) <= int(free.nfe[0])


def test_each_forward_is_one_step_of_each_row_it_ran_on() -> None:
    sampler = block_sampler("klass", block_cache=True)
    rows = len(PROMPTS)
    width = max(map(len, PROMPTS)) + 20
    tokens = torch.full((rows, width), MASK_ID)
    keep = torch.zeros(rows, width, dtype=torch.bool)
    for row, prompt in enumerate(PROMPTS):
        tokens[row, width - 20 - len(prompt): width - 20] = torch.tensor(prompt)
        keep[row, width - 20 - len(prompt):] = True
    tokens[~keep] = 0
    counter = ForwardCounter(network(), rows)
    sampled = sampler.sample(counter, tokens, MASK_ID, attention_mask=keep)
    assert counter.nfe.tolist() == sampled.steps.tolist()
    revealed = sampled.reveal_step[keep & (tokens == MASK_ID)]
    assert (revealed >= 0).all() and (sampled.reveal_step[tokens != MASK_ID] == -1).all()


def test_the_exact_cache_gives_what_a_full_forward_over_the_prefix_gives() -> None:
    # one token a step (threshold 1): the cached decoder's choices equal greedy block decoding recomputed from
    # scratch, each step a full block-causal forward over everything so far
    net, prompt, block = network(), PROMPTS[2], 16
    sampler = BlockDiffusionSampler(block_size=block, sub_block=block,
                                    rule=ThresholdSampler(tau=1.0))
    cached = api.fill(net, [prompt], sampler, 12, MASK_ID).tokens[0].tolist()
    x = torch.tensor([prompt + [MASK_ID] * 12])
    from mdmkit.models.llm.diffusion_lm import block_causal_mask

    while (x == MASK_ID).any():
        first = int((x[0] == MASK_ID).nonzero()[0])
        end = min((first // block + 1) * block, x.shape[1])
        if first % block == 0:  # a block's first token: predicted from the committed prefix alone
            seen = x[:, :first + 1]
        else:
            seen = x[:, :end]
        positions = torch.arange(seen.shape[1])[None]
        logits = net(seen, block_causal_mask(positions, positions, block))
        logits[..., MASK_ID] = float("-inf")
        scores = logits.softmax(-1).max(-1)
        masked = seen == MASK_ID
        best = torch.where(masked, scores.values, -1.0).argmax(1)
        x[0, best] = scores.indices[0, best]
    assert cached == x[0].tolist()


def test_what_cannot_run_in_a_block_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"rule=WinoSampler.*expected .*MaskedSampler \| .*Llada2Sampler"):
        BlockDiffusionSampler(rule=build(option("sampler", "wino"), "sampler"))
    with pytest.raises(ConfigError, match="rule.block_length must be null"):
        BlockDiffusionSampler(rule=ThresholdSampler(block_length=8))
    with pytest.raises(ConfigError, match="sub_block=3 must divide block_size=32"):
        BlockDiffusionSampler(sub_block=3)
    # block diffusion decodes block-causal networks only; the masked loop's approximate caches bidirectional ones
    from mdmkit.core.errors import CapabilityError
    from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig

    bidirectional = DiffusionLM(DiffusionLMConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2,
                                                  mlp_hidden=32, mask_id=49))
    with pytest.raises(CapabilityError, match="block diffusion decodes block-causal networks .*sampler=eb"):
        api.fill(bidirectional, [[1, 2, 3]], BlockDiffusionSampler(), 8, 49)
    approximate = ThresholdSampler(block_length=8, cache="prefix")
    with pytest.raises(ConfigError, match="cache=prefix approximates a bidirectional network; .*block_diffusion"):
        api.fill(network(), [PROMPTS[0]], approximate, 8, MASK_ID)

"""Fast-dLLM's three LLaDA decoders, token for token: `generate`, `generate_with_prefix_cache` and
`generate_with_dual_cache` (NVlabs/Fast-dLLM llada/generate.py) against mdmkit's `fastdllm_threshold` /
`fastdllm_factor` presets with `cache=none|prefix|dual`, on the tiny LLaDA fixture, through the Python API.

`../shared/reference_models/llada/fastdllm_generate.json` (FASTDLLM_GENERATE.md there) holds 108 runs of the
official code. One (case 57) never ends there: the official loop can write the mask token back, mdmkit never
does (docs/samplers.md); it is checked to end here with no mask left.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

from mdmkit import api

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models")) / "llada"
FIXTURE = REFERENCE / "fastdllm_generate.json"
pytestmark = [pytest.mark.skipif(not FIXTURE.is_file(), reason=f"Fast-dLLM's outputs not found: {FIXTURE}"),
              pytest.mark.usefixtures("one_thread")]
CASES = json.loads(FIXTURE.read_text())["cases"] if FIXTURE.is_file() else []


@cache
def network():
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(REFERENCE, "llada")


def run(case: dict) -> api.Filled:
    params = case["params"]
    if case["rule"] == "threshold":
        sampler = api.sampler("fastdllm_threshold", tau=params["threshold"])
    else:
        sampler = api.sampler("fastdllm_factor", factor=params["factor"])
    sampler.block_length, sampler.cache = params["block_length"], case["cache"]
    return api.fill(network(), [case["prompt"]], sampler, params["gen_length"], case["mask_id"])


@pytest.mark.parametrize("case", [c for c in CASES if c["terminated"]], ids=lambda c: f"{c['id']}-{c['cache']}")
def test_the_presets_reproduce_fast_dllms_decoders(case: dict) -> None:
    filled = run(case)
    assert filled.tokens[0].tolist() == case["output"]
    assert int(filled.nfe[0]) == case["nfe"]


def test_where_the_official_loop_writes_the_mask_back_and_never_ends_mdmkit_ends() -> None:
    (case,) = [c for c in CASES if not c["terminated"]]
    filled = run(case)
    assert case["mask_id"] not in filled.tokens[0].tolist() and int(filled.nfe[0]) < case["forwards_before_abort"]

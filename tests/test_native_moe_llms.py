"""mdmkit's own LLaDA-MoE and LLaDA2.0 networks against the official remote code's outputs, and the MoE layer.

The fixtures (`../shared/reference_models/llada_moe`, `llada2_mini`, or `$MDMKIT_REFERENCE_MODELS`) are tiny random
checkpoints in the hub's exact format with the float32 logits and router outputs the unmodified hub code computed
(their SOURCE.md). Nothing here downloads or runs remote code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURE_LOGITS, ROOT
from tiny_text_models import sharded_copy

from mdmkit import api
from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.models.denoiser import KV_CACHE, KVCache
from mdmkit.models.llm.checkpoints import load_diffusion_lm
from mdmkit.models.llm.moe import MoE, MoEConfig
from mdmkit.samplers import ForwardCounter

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
FOLDER = {"llada_moe": "llada_moe", "llada2": "llada2_mini"}
MASK_ID = 1023
pytestmark = pytest.mark.usefixtures("one_thread")
needs_fixtures = pytest.mark.skipif(
    not all((REFERENCE / folder / "expected.safetensors").is_file() for folder in FOLDER.values()),
    reason=f"reference model fixtures not found: {REFERENCE}")


def expected(kind: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(REFERENCE / FOLDER[kind] / "expected.safetensors")


def load(kind: str, directory: Path | None = None, **kwargs):
    # LLaDA2.0's config names no mask token (its generate takes mask_id): the fixture's is passed
    mask = {"mask_id": MASK_ID} if kind == "llada2" else {}
    return load_diffusion_lm(directory or REFERENCE / FOLDER[kind], kind, **mask, **kwargs)


@pytest.fixture(scope="module", params=list(FOLDER))
def reference(request: pytest.FixtureRequest):
    if not all((REFERENCE / folder / "expected.safetensors").is_file() for folder in FOLDER.values()):
        pytest.skip(f"reference model fixtures not found: {REFERENCE}")
    kind = request.param
    return kind, load(kind), expected(kind)


def routed_input(network, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """The input of layer `layer`'s MoE for the forward of `ids` (as a hook on the hub's gate saw it)."""
    seen = []
    handle = network.blocks[layer].mlp.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    network(ids)
    handle.remove()
    return seen[0].reshape(-1, seen[0].shape[-1])


# -- logits and routing against the hub code -----------------------------------------------------------------


@torch.no_grad()
def test_logits_and_router_outputs_equal_the_remote_codes(reference) -> None:
    kind, network, data = reference
    ids = data["input_ids"]
    if kind == "llada_moe":
        torch.testing.assert_close(network(ids), data["logits_full"], **FIXTURE_LOGITS)
    else:  # its generate's call: the block-causal mask of blocks of 32 (and of 8), positions 0..L-1
        torch.testing.assert_close(network(ids), data["logits_block32"], **FIXTURE_LOGITS)
        torch.testing.assert_close(network(ids[:, :32]), data["logits_block32_window32"], **FIXTURE_LOGITS)
        network.config.attention_block = 8
        try:
            torch.testing.assert_close(network(ids), data["logits_block8"], **FIXTURE_LOGITS)
        finally:
            network.config.attention_block = 32
    chosen, weights, logits = network.blocks[1].mlp.route(routed_input(network, 1, ids))
    shape = data["router_topk_experts_layer1"].shape
    torch.testing.assert_close(logits.view(*shape[:2], -1), data["router_logits_layer1"], **FIXTURE_LOGITS)
    assert torch.equal(chosen.view(shape), data["router_topk_experts_layer1"].long())
    torch.testing.assert_close(weights.view(shape), data["router_topk_weights_layer1"], **FIXTURE_LOGITS)


@torch.no_grad()
def test_llada_moe_attends_to_padding_and_honours_position_ids_as_its_code_does(reference) -> None:
    kind, network, data = reference
    if kind != "llada_moe":
        pytest.skip("LLaDA-MoE's mask behaviour")
    padded, keep = data["input_ids_padded"], data["keep"]
    torch.testing.assert_close(network(padded, keep[:, None, None, :]), data["logits_padded"], **FIXTURE_LOGITS)
    torch.testing.assert_close(network(padded, positions=data["position_ids_padded"]),
                               data["logits_padded_posids"], **FIXTURE_LOGITS)


@torch.no_grad()
def test_llada2s_other_mask_paths_are_the_same_network_under_their_pattern(reference) -> None:
    # its hub forward without a mask attends bidirectionally (SDPA), with a 2-D padding mask causally plus padding,
    # and eager without a mask causally; the native network is block-causal (its generate's pattern) and computes
    # each of the others when given it: attention_block unset, or the pattern as an explicit mask
    kind, network, data = reference
    if kind != "llada2":
        pytest.skip("LLaDA2.0's mask paths")
    ids, keep, length = data["input_ids"], data["keep"], data["input_ids"].shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    network.config.attention_block = None
    try:
        torch.testing.assert_close(network(ids), data["logits_nomask"], **FIXTURE_LOGITS)
    finally:
        network.config.attention_block = 32
    padded = network(data["input_ids_padded"], causal[None, None] & keep[:, None, None, :])
    torch.testing.assert_close(padded[keep], data["logits_pad2d"][keep], **FIXTURE_LOGITS)  # real tokens
    torch.testing.assert_close(network(ids, causal), data["logits_eager_nomask"], atol=5e-5, rtol=0)  # eager kernel


@torch.no_grad()
def test_bfloat16_weights_stay_close_to_float32(reference) -> None:
    kind, network, data = reference
    half = load(kind, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    logits = half(data["input_ids"])
    assert logits.dtype == torch.float32
    # logits span about +-6; a near tie between experts may route a token differently in bfloat16
    assert (logits - network(data["input_ids"])).abs().mean() < 0.25


@torch.no_grad()
def test_a_sharded_checkpoint_loads_like_a_single_file(reference, tmp_path: Path) -> None:
    kind, network, data = reference
    sharded_copy(REFERENCE / FOLDER[kind], tmp_path)
    assert torch.equal(load(kind, tmp_path)(data["input_ids"]), network(data["input_ids"]))


def test_active_parameters_leave_out_the_experts_a_token_is_not_sent_to(reference) -> None:
    _, network, _ = reference
    moe = network.config.moe
    one_expert = 3 * network.config.d_model * moe.expert_hidden
    assert network.active_parameters() == network.num_parameters() - (moe.experts - moe.top_k) * one_expert


# -- KV cache -------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_a_cached_prefix_gives_the_logits_of_one_full_forward(reference) -> None:
    # LLaDA-MoE: the first n tokens attend to themselves only, the rest to all; LLaDA2.0: its block-causal pattern,
    # whose finished blocks are exactly a cache
    kind, network, data = reference
    ids, n = data["input_ids"], (10 if kind == "llada_moe" else 32)
    length = ids.shape[1]
    assert KV_CACHE in network.capabilities
    if kind == "llada_moe":
        allowed = torch.ones(length, length, dtype=torch.bool)
        allowed[:n, n:] = False
        full = network(ids, allowed)
    else:
        full = network(ids)
    cache = KVCache.empty(network.n_layers)
    first = network(ids[:, :n], cache=cache, commit=n)
    second = network(ids[:, n:], positions=torch.arange(n, length)[None], cache=cache)
    # (a masked and an unmasked attention kernel: same math, another summation order)
    torch.testing.assert_close(first, full[:, :n], atol=5e-5, rtol=0)
    torch.testing.assert_close(second, full[:, n:], atol=5e-5, rtol=0)


# -- the MoE layer -------------------------------------------------------------------------------------------


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the definition the grouped computation must equal."""
    chosen, weights, _ = moe.route(x)
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(chosen.shape[1]):
            e = int(chosen[token, slot])
            h = F.silu(moe.gate[e] @ x[token]) * (moe.up[e] @ x[token])
            out[token] += weights[token, slot] * (moe.down[e] @ h)
    return out + (moe.shared(x) if moe.shared is not None else 0)


@pytest.mark.parametrize("settings", [
    {"router": "softmax", "expert_bias": True, "bias_in_weights": True, "shared_hidden": 12},
    {"router": "sigmoid", "router_fp32": True, "expert_bias": True, "groups": 4, "top_groups": 2, "normalize": True,
     "scale": 2.5, "combine_fp32": True},
    {"router": "sigmoid", "normalize": False},
], ids=["softmax-biased-weights", "sigmoid-groups", "sigmoid-plain"])
@pytest.mark.parametrize("hidden", [16, 10], ids=["grouped-product", "loop-over-experts"])  # 40-byte rows: no grouping
@torch.no_grad()
def test_experts_grouped_by_id_equal_the_token_by_token_sum(settings: dict, hidden: int) -> None:
    from mdmkit.models.llm import moe as moe_module

    torch.manual_seed(0)
    moe = MoE(16, MoEConfig(experts=8, top_k=2, expert_hidden=hidden, layers=(0,), **settings))
    assert moe._groupable(torch.zeros(1, 16)) == (hidden == 16 and moe_module._grouped_mm is not None)
    for parameter in moe.parameters():
        parameter.normal_(0, 0.4)
    if moe.expert_bias is not None:
        moe.expert_bias.normal_(0, 0.05)
    x = torch.randn(37, 16)
    torch.testing.assert_close(moe(x), naive_moe(moe, x), atol=1e-5, rtol=0)


@torch.no_grad()
def test_group_limited_routing_picks_only_inside_the_best_groups() -> None:
    moe = MoE(4, MoEConfig(experts=8, top_k=2, expert_hidden=2, layers=(0,), router="sigmoid", groups=4,
                           top_groups=1, expert_bias=True))
    moe.router.weight.zero_()
    # every score is 0.5: the bias alone ranks; group 2 (experts 4, 5) has the best pair, expert 0 the best single
    moe.expert_bias.copy_(torch.tensor([0.9, 0.0, 0.1, 0.1, 0.5, 0.5, 0.0, 0.0]))
    chosen, weights, _ = moe.route(torch.zeros(1, 4))
    assert sorted(chosen[0].tolist()) == [4, 5]
    assert weights.tolist() == [[0.5, 0.5]]  # the bias ranks, the unbiased scores weight


def test_bad_moe_shapes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="top_k=9"):
        MoEConfig(experts=8, top_k=9, expert_hidden=2, layers=(0,))
    with pytest.raises(ConfigError, match="groups=3 must divide"):
        MoEConfig(experts=8, top_k=2, expert_hidden=2, layers=(0,), groups=3)


# -- one-line refusals ---------------------------------------------------------------------------------------


def copy_fixture(kind: str, directory: Path, **config: object) -> Path:
    directory.mkdir()
    shutil.copy(REFERENCE / FOLDER[kind] / "model.safetensors", directory / "model.safetensors")
    raw = json.loads((REFERENCE / FOLDER[kind] / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, **config}))
    return directory


@needs_fixtures
@pytest.mark.parametrize("kind, field, value, message", [
    ("llada_moe", "hidden_act", "gelu", "is not supported"), ("llada_moe", "clip_qkv", 8.0, "is not supported"),
    ("llada_moe", "attention_bias", True, "is not supported"),
    ("llada_moe", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "is not supported"),
    ("llada_moe", "moe_router_score_function", "sigmoid", "always runs 'softmax'"),
    ("llada_moe", "moe_layer_freq", [0, 2], "must list 0 .dense. or 1"),
    ("llada2", "use_bias", True, "is not supported"), ("llada2", "use_sliding_window", True, "is not supported"),
    ("llada2", "score_function", "softmax", "always runs 'sigmoid'"),
    ("llada2", "router_dtype", "bf16", "always runs 'fp32'"),
    ("llada2", "norm_topk_prob", False, "always runs True"),
    ("llada2", "head_dim", 32, "is not supported"),
    ("llada2", "rotary_dim", 16, "contradicts partial_rotary_factor"),
    ("llada2", "partial_rotary_factor", 1.5, "must lie in"),
])
def test_a_setting_the_network_does_not_compute_is_refused_in_one_line(kind: str, field: str, value: object,
                                                                      message: str, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{field}=.*{message}") as caught:
        load(kind, copy_fixture(kind, tmp_path / "model", **{field: value}))
    assert "\n" not in str(caught.value)


@needs_fixtures
def test_fields_its_code_ignores_load_as_its_code_runs(tmp_path: Path) -> None:
    # LLaDA-MoE's code never normalises, scales or groups its top-k, whatever its config says
    ignored = {"norm_topk_prob": False, "routed_scaling_factor": 3.0, "router_num_group": 4, "router_topk_group": 1}
    network = load("llada_moe", copy_fixture("llada_moe", tmp_path / "model", **ignored))
    moe = network.config.moe
    assert (moe.normalize, moe.scale, moe.groups, moe.bias_in_weights) == (False, 1.0, 1, True)


@needs_fixtures
@pytest.mark.parametrize("kind, other", [("llada_moe", "llada"), ("llada", "llada_moe"), ("llada2", "fast_dllm_v2")])
def test_a_checkpoint_loaded_as_another_kind_says_which_kind_it_is(kind: str, other: str) -> None:
    # LLaDA-MoE's config says model_type llada, as LLaDA's does: its architecture tells them apart
    folder = REFERENCE / FOLDER.get(kind, kind)
    with pytest.raises(CheckpointError, match=f"not {other}: load it as kind {kind}"):
        load_diffusion_lm(folder, other, mask_id=MASK_ID)


@needs_fixtures
def test_a_missing_expert_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    directory = copy_fixture("llada2", tmp_path / "model")
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing from the checkpoint, e.g. 'model.layers.1.mlp.experts.3.up"):
        load("llada2", directory)


@needs_fixtures
@torch.no_grad()
def test_llada_moe_reproduces_llada_generate_with_the_llada_preset() -> None:
    # LLaDA's low-confidence `generate` (total steps over gen_length / block_length blocks), left padding included:
    # the network attends to the padding as the hub code does, positions stay 0..L-1
    network = load("llada_moe")
    cases = json.loads((REFERENCE / "llada_moe" / "generate.json").read_text())
    assert len(cases) == 10
    for case in cases:
        assert (case["temperature"], case["cfg_scale"], case["remasking"]) == (0, 0, "low_confidence")
        blocks = case["gen_length"] // case["block_length"]
        sampler = api.sampler("llada", steps=case["steps"] // blocks, block_length=case["block_length"])
        prompt = torch.tensor(case["prompt"])
        rows, new = prompt.shape[0], case["gen_length"]
        tokens = torch.cat([prompt, torch.full((rows, new), MASK_ID)], 1)
        keep = None
        if case["attention_mask"] is not None:
            keep = torch.cat([torch.tensor(case["attention_mask"]).bool(), torch.ones(rows, new, dtype=torch.bool)], 1)
        counter = ForwardCounter(network, rows)
        out = sampler.sample(counter, tokens, MASK_ID, torch.Generator().manual_seed(0), attention_mask=keep)
        assert out.tokens.tolist() == case["sequences"]
        assert counter.nfe.tolist() == [case["steps"]] * rows


@needs_fixtures
def test_the_real_llada2_mini_config_reads_to_the_model_cards_sizes(tmp_path: Path) -> None:
    # the hub config's sizes on the fixture's config (SOURCE.md): the network on the meta device has the card's
    # 16B parameters, 1.4B of them active per token (embedding and output layer counted)
    from mdmkit.models.llm.checkpoints import read_config
    from mdmkit.models.llm.diffusion_lm import DiffusionLM

    real = {"vocab_size": 157184, "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 5120, "num_experts": 256,
            "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "moe_intermediate_size": 512, "rotary_dim": 64,
            "max_position_embeddings": 32768}
    config = read_config(copy_fixture("llada2", tmp_path / "model", **real), "llada2", mask_id=156895)
    assert (config.rotary_dim, config.attention_block, config.moe.layers[0], len(config.moe.layers)) == (64, 32, 1, 19)
    with torch.device("meta"):
        network = DiffusionLM(config)
    assert round(network.num_parameters() / 1e9, 1) == 16.3 and round(network.active_parameters() / 1e9, 1) == 1.4

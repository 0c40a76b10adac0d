"""mdmkit's own Fast-dLLM v2 network (`hf.kind=fast_dllm_v2`) against the hub remote code's outputs.

`../shared/reference_models/fast_dllm_v2` (or `$MDMKIT_REFERENCE_MODELS`) is a tiny random checkpoint in the hub's
format with the logits the unmodified remote code computed under transformers 4.57 (its SOURCE.md): full
forwards with block-causal attention in blocks of 32 and 8, the prefix-cache prefill, a block against that cache,
and the sub-block "block cache" steps. The remote code returns raw logits; mdmkit's network returns them shifted
(position i reads the output of i - 1), as the model's own `generate` reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import FIXTURE_LOGITS, ROOT
from tiny_text_models import sharded_copy

from mdmkit.core.errors import CheckpointError
from mdmkit.models.denoiser import KVCache
from mdmkit.models.llm.checkpoints import load_diffusion_lm
from mdmkit.models.llm.diffusion_lm import DiffusionLM, block_causal_mask

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
FIXTURE = REFERENCE / "fast_dllm_v2"
MASK_ID = 1023  # the fixture's mask token: passed to the reference's generate, not a config field
pytestmark = [
    pytest.mark.skipif(not (FIXTURE / "expected.safetensors").is_file(),
                       reason=f"Fast-dLLM v2 reference fixture not found: {FIXTURE}"),
    pytest.mark.usefixtures("one_thread"),
]


def shifted(logits: torch.Tensor) -> torch.Tensor:
    """The remote code's raw logits as mdmkit's network returns them (within one call)."""
    return torch.cat([logits[:, :1], logits[:, :-1]], 1)


@pytest.fixture(scope="module")
def network() -> DiffusionLM:
    return load_diffusion_lm(FIXTURE, "fast_dllm_v2", mask_id=MASK_ID)


@pytest.fixture(scope="module")
def data() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(FIXTURE / "expected.safetensors")


def assert_logits(ours: torch.Tensor, raw: torch.Tensor) -> None:
    torch.testing.assert_close(ours, shifted(raw), **FIXTURE_LOGITS)


@torch.no_grad()
def test_full_forwards_are_block_causal_from_absolute_position_zero(network, data) -> None:
    ids = data["input_ids"]
    config = network.config
    assert (config.attention_block, config.qkv_bias, config.shift_logits, config.rope_fp32) == (32, True, True, False)
    positions = torch.arange(ids.shape[1])[None]
    assert torch.equal(block_causal_mask(positions, positions, 32)[0, 0], data["eval_mask_bs32"])
    assert_logits(network(ids), data["logits_bs32"])  # the default mask: the config's block (bd_size)
    assert_logits(network(ids, block_causal_mask(positions, positions, 8)), data["logits_bs8"])


@torch.no_grad()
def test_the_prefix_cache_and_a_cached_block_equal_the_remote_codes(network, data) -> None:
    ids = data["input_ids"]
    cache = KVCache.empty(network.n_layers)
    assert_logits(network(ids[:, :32], cache=cache, commit=32), data["logits_prefix32"])
    assert cache.length == 32
    block = network(ids[:, 32:], cache=cache)  # positions follow the cache; the block sees all of it and itself
    assert cache.length == 32
    assert_logits(block, data["logits_cached_block"])
    assert_logits(block, data["logits_blockcache_full"])
    torch.testing.assert_close(block, shifted(data["logits_bs32"][:, 32:]), **FIXTURE_LOGITS)


@torch.no_grad()
def test_a_sub_block_step_against_the_block_cache_equals_the_remote_codes(network, data) -> None:
    # The reference's sub-block step at block offset 8: the sub-block's queries attend, without a mask, to the
    # prefix cache and to the block cache with the sub-block's own entries replaced by fresh ones. Here the
    # sub-block is the block's tail, so that is the prefix and the block's first 8 tokens (as the block's full
    # forward computed them), then the sub-block.
    ids = data["input_ids"]
    cache = KVCache.empty(network.n_layers)
    network(ids[:, :32], cache=cache, commit=32)
    network(ids[:, 32:], cache=cache, commit=8)
    sub = network(ids[:, 40:], positions=torch.arange(40, 45)[None], attn_mask=torch.ones(1, 1, 5, 45, dtype=bool),
                  cache=cache)
    assert_logits(sub, data["logits_blockcache_sub8"])


@torch.no_grad()
def test_bfloat16_weights_stay_close_to_float32(network, data) -> None:
    half = load_diffusion_lm(FIXTURE, "fast_dllm_v2", dtype=torch.bfloat16, mask_id=MASK_ID)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    logits = half(data["input_ids"])
    assert logits.dtype == torch.float32
    reference = network(data["input_ids"])
    # the fixture's weights are large (std 0.4), so bfloat16 rounding moves logits visibly, never their direction
    assert torch.nn.functional.cosine_similarity(logits, reference, dim=-1).min() > 0.95
    assert (logits - reference).abs().mean() < 0.1 * reference.abs().mean()


def copy_fixture(directory: Path, drop: tuple[str, ...] = (), **config: object) -> Path:
    from safetensors.torch import load_file, save_file

    directory.mkdir()
    tensors = load_file(FIXTURE / "model.safetensors")
    save_file({name: t for name, t in tensors.items() if name not in drop}, directory / "model.safetensors")
    raw = json.loads((FIXTURE / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, **config}))
    return directory


@torch.no_grad()
def test_sharded_and_tied_checkpoints_load(network, data, tmp_path: Path) -> None:
    sharded_copy(FIXTURE, tmp_path / "sharded")
    sharded = load_diffusion_lm(tmp_path / "sharded", "fast_dllm_v2", mask_id=MASK_ID)
    assert torch.equal(sharded(data["input_ids"]), network(data["input_ids"]))
    # the 1.5B ties its output layer to the embedding: no lm_head tensor (or one saved anyway, ignored)
    tied = load_diffusion_lm(copy_fixture(tmp_path / "tied", drop=("lm_head.weight",), tie_word_embeddings=True),
                             "fast_dllm_v2", mask_id=MASK_ID)
    assert tied.head is None
    from safetensors.torch import load_file

    embedding = load_file(FIXTURE / "model.safetensors")["model.embed_tokens.weight"]
    hidden = tied.norm(tied.hidden(data["input_ids"]))
    torch.testing.assert_close(tied(data["input_ids"]), shifted(hidden @ embedding.T))


def test_checkpoint_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="mask_id=151665 must be a token id below vocab_size=1024") as caught:
        load_diffusion_lm(FIXTURE, "fast_dllm_v2")  # the hub's mask id does not fit the tiny vocabulary
    assert "\n" not in str(caught.value)
    with pytest.raises(CheckpointError, match="layer_types=.* is not supported"):
        load_diffusion_lm(copy_fixture(tmp_path / "sliding", layer_types=["sliding_attention"] * 2), "fast_dllm_v2")
    with pytest.raises(CheckpointError, match="rope_scaling=.* is not supported"):
        load_diffusion_lm(copy_fixture(tmp_path / "scaled", rope_scaling={"rope_type": "yarn"}), "fast_dllm_v2")
    with pytest.raises(CheckpointError, match=r"Fast_dLLM_Qwen checkpoint \(model_type\), not dream: .*"
                                              r"hf.kind=fast_dllm_v2"):
        load_diffusion_lm(FIXTURE, "dream")

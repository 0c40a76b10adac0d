"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B): Qwen2.5 attending block-causally in blocks of `bd_size`,
decoded by block diffusion with finished blocks in an exact KV cache."""

from __future__ import annotations

from typing import Any

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields
from mdmkit.models.llm.kinds import _qwen2
from mdmkit.models.llm.registry import ModelKind, register_kind

MASK_ID = 151665  # its `|<MASK>|` (its generate's default mask_id; not in its config.json)
BLOCK = 32  # the block its forward's attention is built for (its `bd_size` in every released config)


def read(fields: ConfigFields) -> dict[str, Any]:
    # Fast_dLLM_QwenConfig (a Qwen2Config with `bd_size`); its q/k/v biases are always on, its training-only
    # fields (`conplemenrary_mask`) do not change inference.
    _qwen2.checks(fields)
    layer_types = fields.raw.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise CheckpointError(f"{fields.source}: layer_types={layer_types!r} is not supported by mdmkit's network "
                              "(only full_attention)")
    return {**_qwen2.shape(fields, MASK_ID), "attention_block": fields.get("bd_size", BLOCK)}


KIND = register_kind(ModelKind(
    "fast_dllm_v2", load_native, "Fast-dLLM v2: block-causal block diffusion, mdmkit's own network",
    attention="block_causal", architecture=Architecture(read, _qwen2.NAMES, _qwen2.HEAD),
    declares=lambda raw: str(raw.get("model_type", "")).lower() == "fast_dllm_qwen",
    tokenizer_mask="|<MASK>|",  # its tokenizer does not declare it as mask_token
    lora=True, export=True,
    shapes={"fast-dllm-v2-7b": DiffusionLMConfig(  # Qwen2.5-7B-Instruct's shape in blocks of 32
        vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, mlp_hidden=18944, mask_id=151665,
        rope_theta=1e6, rms_eps=1e-6, max_positions=4096, qkv_bias=True, rope_fp32=False, pad_positions=True,
        shift_logits=True, attention_block=BLOCK)},
))

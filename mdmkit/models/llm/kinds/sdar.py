"""SDAR (JetLM/SDAR-1.7B/4B/8B-Chat) and TraDo (Gen-Verse/TraDo-4B/8B-Instruct, the same `sdar` model type):
Qwen3 layers (RMSNorm over each head's queries and keys before the rotation, grouped-query attention, an untied
output layer) trained as block diffusion in small blocks, decoded by `sampler=sdar`.

Its official forward takes the caller's attention mask unchanged: its generate passes the block-causal pattern of
the block size it decodes with, so any block size works and the walk's masks say which. `block_size` in config.json
(4 where present) is only the network's own pattern for a forward given no mask. No logits shift: position i's
logits predict token i.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, TensorNames
from mdmkit.models.llm.kinds import _qwen2
from mdmkit.models.llm.registry import ExampleModel, ModelKind, register_kind

MASK_ID = 151669  # `<|MASK|>` of its tokenizer (its mask_token); the repo's configs name it as mask_token_id
BLOCK = 4  # the block its released models are trained and decoded with


def read(fields: ConfigFields) -> dict[str, Any]:
    """SDARConfig (a Qwen3Config; configuration_sdar.py) -> DiffusionLMConfig fields; absent fields take that
    class's defaults. Its training-only fields (flex attention, fused loss, expert parallelism) change no inference."""
    _qwen2.checks(fields)
    fields.refuse("attention_bias", False, False)
    layer_types = fields.raw.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise CheckpointError(f"{fields.source}: layer_types={layer_types!r} is not supported by mdmkit's network "
                              "(only full_attention)")
    d_model, n_heads = fields.get("hidden_size"), fields.get("num_attention_heads")
    head_dim = fields.get("head_dim", 128)
    return {
        "vocab_size": fields.get("vocab_size"),
        "d_model": d_model,
        "n_layers": fields.get("num_hidden_layers"),
        "n_heads": n_heads,
        "n_kv_heads": fields.get("num_key_value_heads", n_heads),
        "mlp_hidden": fields.get("intermediate_size"),
        "mask_id": fields.get("mask_token_id", MASK_ID),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-6, float),
        "max_positions": fields.get("max_position_embeddings", 32768),
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,  # cos/sin cast to the weights' dtype, the rotation there (as Qwen3)
        "pad_positions": True,  # outside the walk (masked samplers), blocks count from each row's first real token
        "qk_norm": True,
        "head_width": None if head_dim * n_heads == d_model else head_dim,
        "attention_block": fields.get("block_size", BLOCK),
    }


def names(config: DiffusionLMConfig) -> TensorNames:
    """Qwen3's hub tensor names: Qwen2's (no q/k/v biases) and each layer's query and key norms."""
    mapped = _qwen2.NAMES(config)
    for i in range(config.n_layers):
        hub, own = f"model.layers.{i}.self_attn.", f"blocks.{i}.attn."
        mapped.update({f"{hub}q_norm.weight": f"{own}q_norm.weight", f"{hub}k_norm.weight": f"{own}k_norm.weight"})
    return mapped


# Qwen3's chat turns without its tools and thinking blocks (what an answer to one question needs)
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + "
                 "'<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
                 "{%- endif %}")


def example_config(vocab_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """A 4-layer SDAR config.json (width 128, 4 heads of 32, 2 key/value heads, blocks of 4) with SDARConfig's
    fields."""
    return {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "hidden_act": "silu", "hidden_size": 128,
            "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_hidden_layers": 4, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False,
            "sliding_window": None, "attention_dropout": 0.0, "block_size": BLOCK, "vocab_size": vocab_size,
            "mask_token_id": ids["<|MASK|>"], "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"]}


KIND = register_kind(ModelKind(
    "sdar", load_native, "SDAR / TraDo: Qwen3 block diffusion in blocks of 4, mdmkit's own network",
    attention="block_causal", architecture=Architecture(read, names, _qwen2.HEAD),
    declares=lambda raw: str(raw.get("model_type", "")).lower() == "sdar",
    lora=True, export=True,
    shapes={"sdar-8b": DiffusionLMConfig(  # JetLM/SDAR-8B-Chat (TraDo-8B-Instruct has its shape)
        vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, mlp_hidden=12288, mask_id=MASK_ID,
        rope_theta=1e6, rms_eps=1e-6, max_positions=4096, rope_fp32=False, pad_positions=True, qk_norm=True,
        attention_block=BLOCK),
        "sdar-4b": DiffusionLMConfig(  # JetLM/SDAR-4B-Chat, Qwen3-4B's shape: heads of 128, not 2560 / 32
            vocab_size=151936, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8, mlp_hidden=9728, mask_id=MASK_ID,
            rope_theta=1e6, rms_eps=1e-6, max_positions=4096, rope_fp32=False, pad_positions=True, qk_norm=True,
            head_width=128, attention_block=BLOCK)},
    example=ExampleModel(example_config, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|MASK|>", CHAT_TEMPLATE,
                         declare_mask=True),
))

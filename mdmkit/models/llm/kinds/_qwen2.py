"""What Dream and Fast-dLLM v2 share with Qwen2: its config fields and its tensor names."""

from __future__ import annotations

from typing import Any

from mdmkit.models.llm.hub_format import ConfigFields, layered_names

HEAD = "lm_head.weight"
NAMES = layered_names(
    top={"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight", HEAD: "head.weight"},
    block="model.layers.{i}.",
    parts={"self_attn.q_proj.weight": "attn.q.weight", "self_attn.k_proj.weight": "attn.k.weight",
           "self_attn.v_proj.weight": "attn.v.weight", "self_attn.o_proj.weight": "attn.o.weight",
           "mlp.gate_proj.weight": "mlp.gate.weight", "mlp.up_proj.weight": "mlp.up.weight",
           "mlp.down_proj.weight": "mlp.down.weight", "input_layernorm.weight": "attn_norm.weight",
           "post_attention_layernorm.weight": "mlp_norm.weight"},
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
)


def checks(fields: ConfigFields) -> None:
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("use_sliding_window", False, False)
    fields.plain_rope()


def shape(fields: ConfigFields, mask_id: int) -> dict[str, Any]:
    """Sizes, q/k/v biases, rotary in the weights' dtype, shifted logits."""
    n_heads = fields.get("num_attention_heads")
    return {
        "vocab_size": fields.get("vocab_size"),
        "d_model": fields.get("hidden_size"),
        "n_layers": fields.get("num_hidden_layers"),
        "n_heads": n_heads,
        "n_kv_heads": fields.get("num_key_value_heads", n_heads),
        "mlp_hidden": fields.get("intermediate_size"),
        "mask_id": fields.get("mask_token_id", mask_id),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-6, float),
        "max_positions": fields.get("max_position_embeddings", 32768),
        "qkv_bias": True,
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,  # Qwen2 casts cos/sin to the weights' dtype and rotates there
        "pad_positions": True,  # position ids = cumsum(attention_mask) - 1 (Dream's sampler; blocks from 0 per row)
        "shift_logits": True,
    }

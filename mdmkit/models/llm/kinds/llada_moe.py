"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Instruct): a bidirectional mixture of experts.

Fields its official code stores but never reads are read as that code runs: it always routes by softmax, never
normalises or scales its top-k weights and has no group-limited routing, whatever `moe_router_score_function`,
`norm_topk_prob`, `routed_scaling_factor` and `router_num_group` say; a config that claims otherwise for one of those
is refused (the official code would compute something else).
"""

from __future__ import annotations

from typing import Any

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, TensorNames
from mdmkit.models.llm.kinds import _moe
from mdmkit.models.llm.registry import ModelKind, register_kind

MASK_ID = 156895  # `<|mask|>` of the LLaDA-MoE / LLaDA2.0 tokenizer (the models' generate default)


def read(fields: ConfigFields) -> dict[str, Any]:
    """LLaDAConfig (configuration_lladamoe.py) -> DiffusionLMConfig fields."""
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("attention_bias", False, False)
    fields.refuse("clip_qkv", None, None)
    fields.plain_rope()
    fields.claims("moe_router_score_function", "softmax", None)
    n_heads, d_model = fields.get("num_attention_heads"), fields.get("hidden_size")
    n_layers = fields.get("num_hidden_layers")
    pattern = fields.raw.get("moe_layer_freq")
    if not isinstance(pattern, list) or len(pattern) != n_layers or any(v not in (0, 1) for v in pattern):
        raise CheckpointError(f"{fields.source}: moe_layer_freq={pattern!r} must list 0 (dense) or 1 (MoE) for each "
                              f"of the {n_layers} layers")
    shared = fields.get("shared_expert_intermediate_size", 0)
    moe = {
        "experts": fields.get("num_experts"), "top_k": fields.get("num_experts_per_tok"),
        "expert_hidden": fields.get("expert_intermediate_size"), "layers": [i for i, v in enumerate(pattern) if v],
        "shared_hidden": shared, "router": "softmax",
        "expert_bias": fields.get("moe_router_enable_expert_bias", False, bool), "bias_in_weights": True,
    }
    return {
        "vocab_size": fields.get("vocab_size"), "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
        "n_kv_heads": fields.get("num_key_value_heads", n_heads),
        "mlp_hidden": fields.get("dense_intermediate_size") if 0 in pattern else 1,
        "mask_id": fields.get("mask_token_id", MASK_ID),
        "rope_theta": fields.get("rope_theta", kind=float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_position_embeddings", 4096),
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,  # cos and sin cast to the activations' dtype, the rotation computed there
        "qk_norm": fields.get("qk_layernorm", False, bool),
        "rotary_dim": fields.rotary_dim(d_model // n_heads, None),
        "attend_padding": True,  # its forward drops every attention mask
        "moe": moe,
    }


def names(config: DiffusionLMConfig) -> TensorNames:
    """LLaDA-MoE's hub tensor names (Qwen2-like attention, OLMoE-like experts, the shared expert on the layer)."""
    names: TensorNames = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not config.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    moe = config.moe
    assert moe is not None, "a mixture of experts' config has its experts"
    for i in range(config.n_layers):
        hub, own = f"model.layers.{i}.", f"blocks.{i}."
        names.update({f"{hub}self_attn.{p}_proj.weight": f"{own}attn.{p}.weight" for p in "qkvo"})
        names.update({f"{hub}input_layernorm.weight": f"{own}attn_norm.weight",
                      f"{hub}post_attention_layernorm.weight": f"{own}mlp_norm.weight"})
        if config.qk_norm:
            names.update({f"{hub}self_attn.{p}_norm.weight": f"{own}attn.{p}_norm.weight" for p in "qk"})
        if i not in moe.layers:
            names.update(_moe.mlp(f"{hub}mlp.", f"{own}mlp"))
            continue
        names[f"{hub}mlp.gate.weight"] = f"{own}mlp.router.weight"
        names.update(_moe.experts(f"{hub}mlp.", f"{own}mlp", moe.experts))
        if moe.expert_bias:
            names[f"{hub}mlp.expert_bias"] = f"{own}mlp.expert_bias"
        if moe.shared_hidden:
            names.update(_moe.mlp(f"{hub}shared_expert.", f"{own}mlp.shared"))
    return names


def declares(raw: Any) -> bool:
    """Its hub config says model_type llada, as LLaDA's: its architecture names it."""
    model_type = str(raw.get("model_type", "")).lower()
    return model_type == "lladamoe" or model_type == "llada" and "LLaDAMoEModelLM" in (raw.get("architectures") or [])


KIND = register_kind(ModelKind(
    "llada_moe", load_native, "LLaDA-MoE: a bidirectional mixture of experts, mdmkit's own network",
    architecture=Architecture(read, names, "lm_head.weight"), declares=declares,
))

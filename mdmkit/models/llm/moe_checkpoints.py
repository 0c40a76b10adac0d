"""config.json readers and tensor names of the mixture-of-experts diffusion LLMs, LLaDA-MoE and LLaDA2.0 (the
`llm_checkpoints` parts of these two).

Fields the official code stores but never reads are read as that code runs: LLaDA-MoE always routes by softmax,
never normalises or scales its top-k weights and has no group-limited routing, whatever
`moe_router_score_function`, `norm_topk_prob`, `routed_scaling_factor` and `router_num_group` say; LLaDA2.0 always
routes by a float32 sigmoid, always has its expert bias and normalises whenever it picks more than one expert. A
config that claims otherwise for one of those is refused (the official code would compute something else).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from mdmkit.core.errors import CheckpointError

LLADA_MOE_MASK_ID = 156895  # `<|mask|>` of the LLaDA-MoE / LLaDA2.0 tokenizer (the models' generate default)
LLADA2_MASK_ID = LLADA_MOE_MASK_ID
LLADA2_BLOCK = 32  # the block its generate decodes and its model card recommends


class Slot(NamedTuple):
    """Where a hub tensor goes: parameter `name`, at `index` of its first axis (one expert of the stacked
    [experts, out, in] parameter) and/or its rows [start, stop) (LLaDA2.0's fused q, k, v); None: the whole."""

    name: str
    index: int | None = None
    rows: tuple[int, int] | None = None


def _rotary_dim(fields: Any, head_dim: int, default: float | None) -> int | None:
    """The rotated dims of a partial rotary (None: the whole head); `default` None: the field is required."""
    name = "partial_rotary_factor"
    factor = fields.get(name, kind=float) if default is None else fields.get(name, default, float)
    if not 0.0 < factor <= 1.0:
        raise CheckpointError(f"{fields.source}: partial_rotary_factor={factor} must lie in (0, 1]")
    dims = int(head_dim * factor)
    return None if dims == head_dim else dims


def _claims(fields: Any, name: str, runs: Any, default: Any) -> None:
    """Refuse a config that says `name` differs from what the official code `runs` (it never reads the field)."""
    value = fields.raw.get(name, default)
    if value is not None and value != runs:
        raise CheckpointError(f"{fields.source}: {name}={value!r}, but the model's code always runs {runs!r} "
                              f"(it never reads this field): refusing a checkpoint whose config says otherwise")


def llada_moe_config(fields: Any) -> dict[str, Any]:
    """LLaDAConfig (configuration_lladamoe.py) -> DiffusionLMConfig fields."""
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("attention_bias", False, False)
    fields.refuse("clip_qkv", None, None)
    fields.plain_rope()
    _claims(fields, "moe_router_score_function", "softmax", None)
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
        "mask_id": fields.get("mask_token_id", LLADA_MOE_MASK_ID),
        "rope_theta": fields.get("rope_theta", kind=float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_position_embeddings", 4096),
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,  # cos and sin cast to the activations' dtype, the rotation computed there
        "qk_norm": fields.get("qk_layernorm", False, bool),
        "rotary_dim": _rotary_dim(fields, d_model // n_heads, None),
        "attend_padding": True,  # its forward drops every attention mask
        "moe": moe,
    }


def llada2_config(fields: Any) -> dict[str, Any]:
    """LLaDA2MoeConfig (configuration_llada2_moe.py) -> DiffusionLMConfig fields (block-causal attention); absent
    fields take that class's defaults."""
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("use_bias", False, True)
    fields.refuse("use_rmsnorm", True, True)
    fields.refuse("norm_head", False, False)
    fields.refuse("norm_softmax", False, False)
    fields.refuse("use_sliding_window", False, False)
    fields.plain_rope()
    _claims(fields, "score_function", "sigmoid", None)
    _claims(fields, "router_dtype", "fp32", None)
    _claims(fields, "moe_router_enable_expert_bias", True, None)
    _claims(fields, "using_split_qkv_in_self_attention", False, None)
    n_heads, d_model, n_layers = fields.get("num_attention_heads"), fields.get("hidden_size"), \
        fields.get("num_hidden_layers")
    head_dim = d_model // n_heads
    if fields.get("head_dim", head_dim) != head_dim:
        raise CheckpointError(f"{fields.source}: head_dim={fields.raw['head_dim']} is not supported by mdmkit's "
                              f"network (only hidden_size / num_attention_heads = {head_dim})")
    rotary = _rotary_dim(fields, head_dim, 0.5)  # the config class's default
    if fields.get("rotary_dim", None) not in (None, rotary or head_dim):
        raise CheckpointError(f"{fields.source}: rotary_dim={fields.raw['rotary_dim']} contradicts "
                              f"partial_rotary_factor (the model's code rotates {rotary or head_dim} dims)")
    top_k = fields.get("num_experts_per_tok")
    _claims(fields, "norm_topk_prob", top_k > 1, None)
    dense = fields.get("first_k_dense_replace", 0)
    expert_hidden = fields.get("moe_intermediate_size")
    moe = {
        "experts": fields.get("num_experts"), "top_k": top_k, "expert_hidden": expert_hidden,
        "layers": list(range(dense, n_layers)), "shared_hidden": expert_hidden * fields.get("num_shared_experts", 0),
        "router": "sigmoid", "router_fp32": True, "expert_bias": True, "bias_in_weights": False,
        "groups": fields.get("n_group", 8), "top_groups": fields.get("topk_group", 4),  # absent: the class's defaults
        "normalize": top_k > 1, "scale": fields.get("routed_scaling_factor", 2.5, float), "combine_fp32": True,
    }
    return {
        "vocab_size": fields.get("vocab_size"), "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
        "n_kv_heads": fields.get("num_key_value_heads"),
        "mlp_hidden": fields.get("intermediate_size") if dense else 1,
        "mask_id": fields.get("mask_token_id", LLADA2_MASK_ID),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_position_embeddings", 16384),
        "qkv_bias": fields.get("use_qkv_bias", False, bool),
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,
        "qk_norm": fields.get("use_qk_norm", True, bool),
        "rotary_dim": rotary,
        "attention_block": LLADA2_BLOCK,
        "rotary_freqs_rounded": True,  # its model card casts the loaded model with .to(bfloat16), frequencies too
        "moe": moe,
    }


_PROJECTIONS = ("gate", "up", "down")


def _experts(prefix: str, own: str, experts: int) -> dict[str, Slot]:
    return {f"{prefix}experts.{e}.{p}_proj.weight": Slot(f"{own}.{p}", e) for e in range(experts) for p in _PROJECTIONS}


def _mlp(prefix: str, own: str) -> dict[str, str]:
    return {f"{prefix}{p}_proj.weight": f"{own}.{p}.weight" for p in _PROJECTIONS}


def llada_moe_names(config: Any) -> dict[str, str | Slot]:
    """LLaDA-MoE's hub tensor names (Qwen2-like attention, OLMoE-like experts, the shared expert on the layer)."""
    names: dict[str, str | Slot] = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not config.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    moe = config.moe
    for i in range(config.n_layers):
        hub, own = f"model.layers.{i}.", f"blocks.{i}."
        names.update({f"{hub}self_attn.{p}_proj.weight": f"{own}attn.{p}.weight" for p in "qkvo"})
        names.update({f"{hub}input_layernorm.weight": f"{own}attn_norm.weight",
                      f"{hub}post_attention_layernorm.weight": f"{own}mlp_norm.weight"})
        if config.qk_norm:
            names.update({f"{hub}self_attn.{p}_norm.weight": f"{own}attn.{p}_norm.weight" for p in "qk"})
        if i not in moe.layers:
            names.update(_mlp(f"{hub}mlp.", f"{own}mlp"))
            continue
        names[f"{hub}mlp.gate.weight"] = f"{own}mlp.router.weight"
        names.update(_experts(f"{hub}mlp.", f"{own}mlp", moe.experts))
        if moe.expert_bias:
            names[f"{hub}mlp.expert_bias"] = f"{own}mlp.expert_bias"
        if moe.shared_hidden:
            names.update(_mlp(f"{hub}shared_expert.", f"{own}mlp.shared"))
    return names


def llada2_names(config: Any) -> dict[str, str | Slot]:
    """LLaDA2.0's hub tensor names (Bailing-MoE layout: fused query_key_value, `dense`, gate with expert_bias)."""
    names: dict[str, str | Slot] = {"model.word_embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not config.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    moe, head_dim = config.moe, config.head_dim
    q, kv = config.n_heads * head_dim, config.n_kv_heads * head_dim
    splits = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    for i in range(config.n_layers):
        hub, own = f"model.layers.{i}.", f"blocks.{i}."
        fused: dict[str, list[Slot]] = {f"{hub}attention.query_key_value.weight":
                                        [Slot(f"{own}attn.{p}.weight", None, rows) for p, rows in splits.items()]}
        if config.qkv_bias:
            fused[f"{hub}attention.query_key_value.bias"] = [Slot(f"{own}attn.{p}.bias", None, rows)
                                                              for p, rows in splits.items()]
        names.update(fused)  # type: ignore[arg-type]
        names.update({f"{hub}attention.dense.weight": f"{own}attn.o.weight",
                      f"{hub}input_layernorm.weight": f"{own}attn_norm.weight",
                      f"{hub}post_attention_layernorm.weight": f"{own}mlp_norm.weight"})
        if config.qk_norm:
            names.update({f"{hub}attention.query_layernorm.weight": f"{own}attn.q_norm.weight",
                          f"{hub}attention.key_layernorm.weight": f"{own}attn.k_norm.weight"})
        if i not in moe.layers:
            names.update(_mlp(f"{hub}mlp.", f"{own}mlp"))
            continue
        names.update({f"{hub}mlp.gate.weight": f"{own}mlp.router.weight",
                      f"{hub}mlp.gate.expert_bias": f"{own}mlp.expert_bias"})
        names.update(_experts(f"{hub}mlp.", f"{own}mlp", moe.experts))
        if moe.shared_hidden:
            names.update(_mlp(f"{hub}mlp.shared_experts.", f"{own}mlp.shared"))
    return names

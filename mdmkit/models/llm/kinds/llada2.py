"""LLaDA2.0 (inclusionAI/LLaDA2.0-mini / -flash): a block-causal mixture of experts decoded by its own generate
(`sampler=llada2`).

Fields its official code stores but never reads are read as that code runs: it always routes by a float32 sigmoid,
always has its expert bias and normalises whenever it picks more than one expert; a config that claims otherwise is
refused (the official code would compute something else).
"""

from __future__ import annotations

from typing import Any

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, Slot, TensorNames
from mdmkit.models.llm.kinds import _moe
from mdmkit.models.llm.moe import MoEConfig
from mdmkit.models.llm.registry import ModelKind, register_kind

MASK_ID = 156895  # `<|mask|>` of its tokenizer (its generate's default)
BLOCK = 32  # the block its generate decodes and its model card recommends


def read(fields: ConfigFields) -> dict[str, Any]:
    """LLaDA2MoeConfig (configuration_llada2_moe.py) -> DiffusionLMConfig fields (block-causal attention); absent
    fields take that class's defaults."""
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("use_bias", False, True)
    fields.refuse("use_rmsnorm", True, True)
    fields.refuse("norm_head", False, False)
    fields.refuse("norm_softmax", False, False)
    fields.refuse("use_sliding_window", False, False)
    fields.plain_rope()
    fields.claims("score_function", "sigmoid", None)
    fields.claims("router_dtype", "fp32", None)
    fields.claims("moe_router_enable_expert_bias", True, None)
    fields.claims("using_split_qkv_in_self_attention", False, None)
    n_heads, d_model, n_layers = fields.get("num_attention_heads"), fields.get("hidden_size"), \
        fields.get("num_hidden_layers")
    head_dim = d_model // n_heads
    if fields.get("head_dim", head_dim) != head_dim:
        raise CheckpointError(f"{fields.source}: head_dim={fields.raw['head_dim']} is not supported by mdmkit's "
                              f"network (only hidden_size / num_attention_heads = {head_dim})")
    rotary = fields.rotary_dim(head_dim, 0.5)  # the config class's default
    if fields.get("rotary_dim", None) not in (None, rotary or head_dim):
        raise CheckpointError(f"{fields.source}: rotary_dim={fields.raw['rotary_dim']} contradicts "
                              f"partial_rotary_factor (the model's code rotates {rotary or head_dim} dims)")
    top_k = fields.get("num_experts_per_tok")
    fields.claims("norm_topk_prob", top_k > 1, None)
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
        "mask_id": fields.get("mask_token_id", MASK_ID),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_position_embeddings", 16384),
        "qkv_bias": fields.get("use_qkv_bias", False, bool),
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,
        "qk_norm": fields.get("use_qk_norm", True, bool),
        "rotary_dim": rotary,
        "attention_block": BLOCK,
        "rotary_freqs_rounded": True,  # its model card casts the loaded model with .to(bfloat16), frequencies too
        "moe": moe,
    }


def names(config: DiffusionLMConfig) -> TensorNames:
    """LLaDA2.0's hub tensor names (Bailing-MoE layout: fused query_key_value, `dense`, gate with expert_bias)."""
    names: TensorNames = {"model.word_embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not config.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    moe, head_dim = config.moe, config.head_dim
    assert moe is not None, "a mixture of experts' config has its experts"
    q, kv = config.n_heads * head_dim, config.n_kv_heads * head_dim
    splits = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    for i in range(config.n_layers):
        hub, own = f"model.layers.{i}.", f"blocks.{i}."
        fused: dict[str, list[Slot]] = {f"{hub}attention.query_key_value.weight":
                                        [Slot(f"{own}attn.{p}.weight", None, rows) for p, rows in splits.items()]}
        if config.qkv_bias:
            fused[f"{hub}attention.query_key_value.bias"] = [Slot(f"{own}attn.{p}.bias", None, rows)
                                                              for p, rows in splits.items()]
        names.update(fused)
        names.update({f"{hub}attention.dense.weight": f"{own}attn.o.weight",
                      f"{hub}input_layernorm.weight": f"{own}attn_norm.weight",
                      f"{hub}post_attention_layernorm.weight": f"{own}mlp_norm.weight"})
        if config.qk_norm:
            names.update({f"{hub}attention.query_layernorm.weight": f"{own}attn.q_norm.weight",
                          f"{hub}attention.key_layernorm.weight": f"{own}attn.k_norm.weight"})
        if i not in moe.layers:
            names.update(_moe.mlp(f"{hub}mlp.", f"{own}mlp"))
            continue
        names.update({f"{hub}mlp.gate.weight": f"{own}mlp.router.weight",
                      f"{hub}mlp.gate.expert_bias": f"{own}mlp.expert_bias"})
        names.update(_moe.experts(f"{hub}mlp.", f"{own}mlp", moe.experts))
        if moe.shared_hidden:
            names.update(_moe.mlp(f"{hub}mlp.shared_experts.", f"{own}mlp.shared"))
    return names


KIND = register_kind(ModelKind(
    "llada2", load_native, "LLaDA2.0: a block-causal mixture of experts, mdmkit's own network",
    attention="block_causal", architecture=Architecture(read, names, "lm_head.weight"),
    declares=lambda raw: str(raw.get("model_type", "")).lower() == "llada2_moe",
    tokenizer_mask="<|mask|>",
    shapes={"llada2-mini": DiffusionLMConfig(  # 16.3B parameters of which 1.4B are active per token
        vocab_size=157184, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, mlp_hidden=5120, mask_id=156895,
        rope_theta=600000.0, rms_eps=1e-6, max_positions=4096, rope_fp32=False, attention_block=32, qk_norm=True,
        rotary_dim=64, rotary_freqs_rounded=True,
        moe=MoEConfig(experts=256, top_k=8, expert_hidden=512, layers=tuple(range(1, 20)), shared_hidden=512,
                      router="sigmoid", router_fp32=True, expert_bias=True, groups=8, top_groups=4, normalize=True,
                      scale=2.5, combine_fp32=True))},
))

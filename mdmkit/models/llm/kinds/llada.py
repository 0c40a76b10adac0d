"""LLaDA (GSAI-ML/LLaDA-8B-Base / -Instruct): a bidirectional Llama-style network in LLaDA's own hub format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, layered_names
from mdmkit.models.llm.registry import ExampleModel, ModelKind, register_kind

MASK_ID = 126336  # LLaDA's [MASK] id (its model card, generate.py and config.json's mask_token_id)
HEAD = "model.transformer.ff_out.weight"


def read(fields: ConfigFields) -> dict[str, Any]:
    # Absent fields take the defaults of LLaDA's ModelConfig, so a config that relies on them is read as LLaDA would.
    for name, supported, default in [("block_type", "llama", "sequential"), ("alibi", False, False),
                                     ("rope", True, False), ("layer_norm_type", "rms", "default"),
                                     ("activation_type", "silu", "swiglu"), ("attention_layer_norm", False, False),
                                     ("include_bias", False, False), ("layer_norm_with_affine", True, True),
                                     ("block_group_size", 1, 1), ("input_emb_norm", False, False),
                                     ("scale_logits", False, False)]:
        fields.refuse(name, supported, default)
    if fields.raw.get("bias_for_layer_norm"):
        fields.refuse("bias_for_layer_norm", False, False)
    n_heads = fields.get("n_heads")
    n_kv_heads = fields.get("n_kv_heads", None)
    multi_query = fields.raw.get("multi_query_attention")
    if n_kv_heads is None:
        n_kv_heads = 1 if multi_query else n_heads
    elif multi_query is not None and n_kv_heads != (1 if multi_query else n_heads):
        raise CheckpointError(f"{fields.source}: n_kv_heads={n_kv_heads} contradicts "
                              f"multi_query_attention={multi_query}")
    d_model = fields.get("d_model")
    return {
        "vocab_size": fields.get("embedding_size", None) or fields.get("vocab_size"),
        "d_model": d_model,
        "n_layers": fields.get("n_layers"),
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "mlp_hidden": fields.get("mlp_hidden_size", None) or fields.get("mlp_ratio", 4) * d_model,
        "mask_id": fields.get("mask_token_id", MASK_ID),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_sequence_length", 1024),
        "qkv_bias": fields.get("include_qkv_bias", False, bool),
        "tie_embeddings": fields.get("weight_tying", True, bool),
        "rope_fp32": fields.get("rope_full_precision", True, bool),
    }


def declares(raw: Any) -> bool:
    """LLaDA-MoE's hub config also says model_type llada: its architecture tells them apart."""
    return str(raw.get("model_type", "")).lower() == "llada" and "LLaDAMoEModelLM" not in (raw.get("architectures")
                                                                                           or [])


ARCHITECTURE = Architecture(
    read,
    layered_names(
        top={"model.transformer.wte.weight": "embed.weight", "model.transformer.ln_f.weight": "norm.weight",
             HEAD: "head.weight"},
        block="model.transformer.blocks.{i}.",
        parts={"q_proj.weight": "attn.q.weight", "k_proj.weight": "attn.k.weight", "v_proj.weight": "attn.v.weight",
               "attn_out.weight": "attn.o.weight", "ff_proj.weight": "mlp.gate.weight",
               "up_proj.weight": "mlp.up.weight", "ff_out.weight": "mlp.down.weight",
               "attn_norm.weight": "attn_norm.weight", "ff_norm.weight": "mlp_norm.weight"},
        qkv=("q_proj", "k_proj", "v_proj")),
    HEAD,
)

# LLaDA-8B-Instruct's tokenizer_config.json chat template: a header per turn, the BOS first, the assistant's header last
CHAT_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                 "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                 "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                 "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}")


def example_config(vocab_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """A 4-layer LLaDA config.json (width 128, 1024 positions) with the hub config's fields."""
    return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "block_type": "llama", "activation_type": "silu",
            "layer_norm_type": "rms", "layer_norm_with_affine": True, "rope": True, "rope_full_precision": True,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "alibi": False, "include_bias": False,
            "include_qkv_bias": False, "weight_tying": False, "d_model": 128, "n_heads": 4, "n_kv_heads": 4,
            "n_layers": 4, "mlp_hidden_size": 384, "mlp_ratio": 3, "max_sequence_length": 1024,
            "vocab_size": vocab_size, "embedding_size": vocab_size, "mask_token_id": ids["<|mdm_mask|>"],
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"], "use_cache": False}


KIND = register_kind(ModelKind(
    "llada", load_native, "LLaDA: bidirectional masked diffusion, mdmkit's own network",
    architecture=ARCHITECTURE, declares=declares, lora=True, export=True, sft_normalize="sequence",
    shapes={"llada-8b": DiffusionLMConfig(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                                          mlp_hidden=12288, mask_id=126336, rope_theta=500000.0, rms_eps=1e-5,
                                          max_positions=4096)},
    example=ExampleModel(example_config, ("<|endoftext|>", "<|startoftext|>", "<|start_header_id|>",
                                          "<|end_header_id|>", "<|eot_id|>"), "<|mdm_mask|>", CHAT_TEMPLATE,
                         bos="<|startoftext|>"),
))

"""A model kind from outside mdmkit, as a user's package would add one (tests/test_model_kind_plugin.py).

"toy" is mdmkit's own bidirectional network stored under a format of its own: config.json fields and tensor names
that no built-in kind reads. The dist-info beside this module names it in the `mdmkit.model_kinds` entry-point
group, so a process with this directory on its path finds it without importing it first.
"""

from __future__ import annotations

from typing import Any

from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, layered_names
from mdmkit.models.llm.registry import ModelKind, register_kind

MODEL_TYPE = "toy_mdm"


def read(fields: ConfigFields) -> dict[str, Any]:
    fields.refuse("activation", "swiglu", "swiglu")
    return {"vocab_size": fields.get("vocab"), "d_model": fields.get("width"), "n_layers": fields.get("depth"),
            "n_heads": fields.get("heads"), "n_kv_heads": fields.get("heads"), "mlp_hidden": fields.get("hidden"),
            "mask_id": fields.get("mask_token_id"), "rope_theta": fields.get("theta", kind=float),
            "rms_eps": fields.get("eps", kind=float), "max_positions": fields.get("positions"),
            "tie_embeddings": False}


NAMES = layered_names(
    top={"toy.embedding": "embed.weight", "toy.final_norm": "norm.weight", "toy.unembedding": "head.weight"},
    block="toy.layer{i}.",
    parts={"wq": "attn.q.weight", "wk": "attn.k.weight", "wv": "attn.v.weight", "wo": "attn.o.weight",
           "w_gate": "mlp.gate.weight", "w_up": "mlp.up.weight", "w_down": "mlp.down.weight",
           "norm_attn": "attn_norm.weight", "norm_mlp": "mlp_norm.weight"},
    qkv=("wq", "wk", "wv"),
)

KIND = register_kind(ModelKind(
    "toy", load_native, "a test's own kind: mdmkit's network in a format of its own",
    architecture=Architecture(read, NAMES, "toy.unembedding"),
    declares=lambda raw: raw.get("model_type") == MODEL_TYPE, lora=True, export=True, sft_normalize="sequence",
))

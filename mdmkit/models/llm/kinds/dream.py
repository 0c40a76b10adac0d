"""Dream (Dream-org/Dream-v0-Instruct-7B): Qwen2 turned bidirectional, with shifted logits (position i reads the
output at i - 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.hub_format import Architecture, ConfigFields
from mdmkit.models.llm.kinds import _qwen2
from mdmkit.models.llm.registry import ExampleModel, ModelKind, register_kind

MASK_ID = 151666  # DreamConfig's default mask_token_id


def read(fields: ConfigFields) -> dict[str, Any]:
    """DreamConfig -> DiffusionLMConfig fields; absent fields take that class's defaults."""
    _qwen2.checks(fields)
    fields.refuse("use_mrope", False, False)
    return _qwen2.shape(fields, MASK_ID)


def tokenizer_options(trust_remote_code: bool) -> dict[str, Any]:
    """Its tokenizer_config names remote code (a Qwen2 byte-level BPE): untrusted, transformers' own Qwen2 loads."""
    return {} if trust_remote_code else {"tokenizer_type": "qwen2"}


# Dream-v0-Instruct's chat template (Qwen2's) without its tool calls: a default system turn, then <|im_start|> turns
CHAT_TEMPLATE = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + "
                 "'<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
                 "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
                 "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endif %}"
                 "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")


def example_config(vocab_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """A 4-layer Dream config.json (width 128, grouped-query attention, 1024 positions) with DreamConfig's fields."""
    return {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_act": "silu", "hidden_size": 128,
            "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
            "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None, "use_mrope": False,
            "attention_dropout": 0.0, "vocab_size": vocab_size, "mask_token_id": ids["<|mask|>"],
            "bos_token_id": ids["<|beginoftext|>"], "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"]}


KIND = register_kind(ModelKind(
    "dream", load_native, "Dream: bidirectional masked diffusion with shifted logits, mdmkit's own network",
    architecture=Architecture(read, _qwen2.NAMES, _qwen2.HEAD),
    declares=lambda raw: str(raw.get("model_type", "")).lower() == "dream",
    tokenizer_options=tokenizer_options, lora=True, export=True, sft_normalize="tokens",
    shapes={"dream-7b": DiffusionLMConfig(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                                          mlp_hidden=18944, mask_id=151666, rope_theta=1e6, rms_eps=1e-6,
                                          max_positions=4096, qkv_bias=True, rope_fp32=False, pad_positions=True,
                                          shift_logits=True)},
    example=ExampleModel(example_config, ("<|endoftext|>", "<|beginoftext|>", "<|im_start|>", "<|im_end|>"),
                         "<|mask|>", CHAT_TEMPLATE, bos="<|beginoftext|>", declare_mask=True),
))

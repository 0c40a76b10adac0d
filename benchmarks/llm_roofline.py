"""Roofline time of one forward of a `DiffusionLM` (dense or mixture of experts), term by term.

Every weight product takes max(bytes moved / bandwidth, FLOPs / peak rate) (`benchmarks.roofline.matmul_time`),
attention is one fused kernel reading the keys and values once (`attention_time`), and the output layer runs on the
columns whose logits the forward returns (`logits_at`). In a mixture-of-experts layer the FLOPs are those of the
experts each token is sent to (top_k routed + the shared one: the active parameters), while the bytes are those of
every expert some token of the forward is sent to: with uniform routing, E (1 - (1 - k/E)^T) of E experts for T
tokens, so a batch-1 step reads few experts and a large batch reads them all.

`canvas_seconds` is the same count for DiffusionGemma's two passes (transformers' network, a Gemma-4 text stack):
sliding layers of `head_dim` wide heads reading at most `sliding_window` keys of the cache, full layers of
`global_head_dim` wide heads whose keys are their values (no value projection), in every layer a dense gated MLP
beside a routed one (`num_experts`, `top_k_experts`); the decoder adds its self-conditioning (the previous step's
probabilities times the embedding, then a gated MLP) and the tied output layer over the whole canvas, the encoder
neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.roofline import Hardware, ModelShape, attention_time, matmul_time
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig


@dataclass
class Forward:
    """One call of the network: rows, new tokens per row, keys per row (cached + new), logit columns per row;
    `encoder`: a canvas network's encoder pass (the others of such a network are its decoder's)."""

    rows: int
    tokens: int
    keys: int
    logits: int
    seconds: float = 0.0
    encoder: bool = False


def touched_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens are sent to, each to `top_k` of `experts` uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _shape(config: DiffusionLMConfig, element_bytes: int) -> ModelShape:
    return ModelShape(name="", hidden_dim=config.d_model, ffn_dim=config.mlp_hidden, num_heads=config.n_heads,
                      head_dim=config.head_dim, num_kv_heads=config.n_kv_heads, num_layers=config.n_layers,
                      vocab_size=config.vocab_size, gated_ffn=True, weight_bytes=element_bytes,
                      activation_bytes=element_bytes, kv_bytes=element_bytes)


def forward_seconds(config: DiffusionLMConfig, forward: Forward, hardware: Hardware, element_bytes: int) -> float:
    """The roofline time of `forward` on `hardware` with weights, activations and KV in `element_bytes`."""
    shape = _shape(config, element_bytes)
    tokens = forward.rows * forward.tokens
    d, heads, kv = config.d_model, config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    projections = sum(matmul_time(tokens, rows, cols, shape, hardware)
                      for rows, cols in ((d, heads), (d, kv), (d, kv), (heads, d)))
    attention = attention_time(shape, hardware, forward.tokens, forward.keys, forward.rows)
    moe = config.moe
    moe_layers = 0 if moe is None else sum(1 for layer in moe.layers if layer < config.n_layers)
    dense_ffn = 3 * matmul_time(tokens, d, config.mlp_hidden, shape, hardware)
    total = config.n_layers * (projections + attention) + (config.n_layers - moe_layers) * dense_ffn
    if moe is not None and moe_layers:
        flops = 2.0 * tokens * 3 * d * (moe.top_k * moe.expert_hidden + moe.shared_hidden)
        weights = 3 * d * (touched_experts(moe.experts, moe.top_k, tokens) * moe.expert_hidden + moe.shared_hidden)
        moved = weights * element_bytes + 2 * tokens * d * element_bytes
        total += moe_layers * max(moved / hardware.memory_bandwidth, flops / hardware.peak_flops)
    return total + matmul_time(forward.rows * forward.logits, d, config.vocab_size, shape, hardware)


def _moe_seconds(tokens: int, d: int, experts: int, top_k: int, hidden: int, hardware: Hardware,
                 element_bytes: int) -> float:
    """A routed gated MLP: the FLOPs of `top_k` experts a token, the bytes of every expert some token touches."""
    flops = 2.0 * tokens * 3 * d * top_k * hidden
    moved = (3 * d * touched_experts(experts, top_k, tokens) * hidden + 2 * tokens * d) * element_bytes
    return max(moved / hardware.memory_bandwidth, flops / hardware.peak_flops)


def canvas_seconds(text: Any, forward: Forward, hardware: Hardware, element_bytes: int) -> float:
    """The roofline time of one pass of a DiffusionGemma network whose text config (a `DiffusionGemmaTextConfig`)
    is `text` (see the module)."""
    d, tokens, heads = text.hidden_size, forward.rows * forward.tokens, text.num_attention_heads
    shape = ModelShape(name="", hidden_dim=d, ffn_dim=text.intermediate_size, num_heads=heads, head_dim=1,
                       num_kv_heads=1, vocab_size=text.vocab_size, gated_ffn=True, weight_bytes=element_bytes,
                       activation_bytes=element_bytes, kv_bytes=element_bytes)
    total = 0.0
    for layer in range(text.num_hidden_layers):
        sliding = text.layer_types[layer] == "sliding_attention"
        width = text.per_layer_config[layer].head_dim
        kv = text.per_layer_config[layer].num_key_value_heads
        layer_shape = ModelShape(name="", hidden_dim=d, ffn_dim=1, num_heads=heads, head_dim=width, num_kv_heads=kv,
                                 weight_bytes=element_bytes, activation_bytes=element_bytes, kv_bytes=element_bytes)
        keys = forward.keys
        if sliding:  # the encoder's causal window; the decoder's canvas over the window of cache it keeps
            keys = min(keys, text.sliding_window) if forward.encoder else \
                min(keys - forward.tokens, text.sliding_window) + forward.tokens
        projections = [(d, heads * width), (d, kv * width), (heads * width, d)] + ([(d, kv * width)] if sliding else [])
        total += sum(matmul_time(tokens, rows, cols, shape, hardware) for rows, cols in projections)
        total += attention_time(layer_shape, hardware, forward.tokens, keys, forward.rows)
        total += 3 * matmul_time(tokens, d, text.intermediate_size, shape, hardware)  # the dense MLP
        total += matmul_time(tokens, d, text.num_experts, shape, hardware)  # the router
        total += _moe_seconds(tokens, d, text.num_experts, text.top_k_experts, text.moe_intermediate_size, hardware,
                              element_bytes)
    if forward.encoder:
        return total
    conditioning = matmul_time(tokens, text.vocab_size, d, shape, hardware) + \
        3 * matmul_time(tokens, d, text.intermediate_size, shape, hardware)
    return total + conditioning + matmul_time(forward.rows * forward.logits, d, text.vocab_size, shape, hardware)

"""mdmkit's own network for pretrained diffusion LLMs (LLaDA, Dream, Fast-dLLM v2, LLaDA-MoE, LLaDA2.0).

All are Llama-style stacks (pre-RMSNorm, rotate-half rotary, grouped-query attention, SwiGLU or MoE MLPs) that
differ only in the settings `DiffusionLMConfig` names; each model's values are read from its hub checkpoint by
`checkpoints` (each kind's format: `kinds/`). The calling convention is `MaskedTransformer`'s, so every sampler
(and the KV cache) works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mdmkit.core.config import Validated, require
from mdmkit.models.denoiser import KV_CACHE, LOGITS_AT, AttentionKind, ForwardCache, positions_from
from mdmkit.models.llm.moe import GatedMLP, MoE, MoEConfig


@dataclass
class DiffusionLMConfig(Validated):
    """Shape and numerics of a LLaDA / Dream-style network (each kind's reader in `kinds/` sets them)."""

    vocab_size: int  # rows of the embedding and of the output layer
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    mask_id: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_positions: int = 4096
    qkv_bias: bool = False
    tie_embeddings: bool = False
    rope_fp32: bool = True  # rotate q/k in float32 (LLaDA); False: in the weights' dtype (Qwen2 / Dream)
    pad_positions: bool = False  # under a key-padding mask, positions start at each row's first real token
    shift_logits: bool = False  # Dream: position i reads the output of i - 1 (position 0 keeps its own)
    attention_block: int | None = None  # block-causal attention in blocks of this many positions (None: bidirectional)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys (weights [head_dim]) before the rotation
    rotary_dim: int | None = None  # rotate the first this many dims of each head, the rest pass (None: all)
    attend_padding: bool = False  # a key-padding mask is ignored (LLaDA-MoE's code drops every attention mask)
    moe: MoEConfig | None = None  # mixture-of-experts MLPs in the layers it names (moe.py)
    # each head's width where it is not d_model / n_heads (Qwen3-4B: 32 heads of 128 at width 2560; None: that)
    head_width: int | None = None
    # the rotary frequencies rounded to the weights' dtype, as in a model cast after loading (`model.to(bfloat16)`
    # casts its frequency buffer too): how LLaDA2.0's model card runs it
    rotary_freqs_rounded: bool = False

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_positions"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        require(self.head_width is not None or self.d_model % self.n_heads == 0,
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} (or head_width set)")
        require(self.head_width is None or self.head_width >= 1, f"head_width={self.head_width} must be >= 1 or null")
        require(self.n_heads % self.n_kv_heads == 0,
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")
        require(self.head_dim % 2 == 0, "rotary positions need an even head dimension")
        require(0 <= self.mask_id < self.vocab_size, f"mask_id={self.mask_id} must be a token id below "
                                                     f"vocab_size={self.vocab_size}")
        require(self.rope_theta > 0 and self.rms_eps > 0, "rope_theta and rms_eps must be > 0")
        require(self.attention_block is None or self.attention_block >= 1,
                f"attention_block={self.attention_block} must be >= 1 or null")
        require(self.rotary_dim is None or (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0),
                f"rotary_dim={self.rotary_dim} must be an even number in [2, head_dim={self.head_dim}] or null")
        require(self.moe is None or all(layer < self.n_layers for layer in self.moe.layers),
                f"moe.layers must be layer indices below n_layers={self.n_layers}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.head_width is None else self.head_width

    @property
    def rotated_dims(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


class RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back, then scaled by the weight in the model's dtype (as both references do)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


@lru_cache(maxsize=8)
def _inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    # computed on the CPU in float32, as both references build their tables
    return (1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)).to(device)


def rotary_angles(positions: torch.Tensor, head_dim: int, theta: float,
                  freqs_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, L, head_dim] in float32 for positions [B, L]; both halves share the frequencies (`head_dim`:
    the rotated dims, under a partial rotary), rounded to `freqs_dtype` first."""
    angles = positions.float()[..., None] * _inv_freq(head_dim, theta, positions.device).to(freqs_dtype).float()
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    """Rotary embedding, rotate-half convention, in float32 (`fp32`) or in x's dtype; a partial rotary (`cos`
    narrower than the head) rotates the head's first dims and passes the rest."""
    if cos.shape[-1] < x.shape[-1]:
        rotated, passed = x.split([cos.shape[-1], x.shape[-1] - cos.shape[-1]], dim=-1)
        return torch.cat([rotate(rotated, cos, sin, fp32), passed], dim=-1)
    work = x.float() if fp32 else x
    cos, sin = cos.to(work.dtype), sin.to(work.dtype)
    first, second = work.chunk(2, dim=-1)
    return (work * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention; the cache keeps rotated keys of the n_kv_heads, unrepeated."""

    def __init__(self, config: DiffusionLMConfig) -> None:
        super().__init__()
        self.config = config
        q_width, kv_width = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.q = nn.Linear(config.d_model, q_width, bias=config.qkv_bias)
        self.k = nn.Linear(config.d_model, kv_width, bias=config.qkv_bias)
        self.v = nn.Linear(config.d_model, kv_width, bias=config.qkv_bias)
        self.o = nn.Linear(q_width, config.d_model, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], attn_mask: Any,
                cache: tuple[ForwardCache, int, int] | None) -> torch.Tensor:
        config = self.config
        batch, length, _ = x.shape
        q = self.q(x).view(batch, length, config.n_heads, config.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, length, config.n_kv_heads, config.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, length, config.n_kv_heads, config.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, *rotary, config.rope_fp32), rotate(k, *rotary, config.rope_fp32)
        if cache is not None:
            store, layer, commit = cache
            k, v = store.attend(layer, k, v, commit)
        # kv head j serves query heads j * groups ... (j + 1) * groups - 1, read in place (no repeated copy)
        grouped = config.n_kv_heads < config.n_heads
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=grouped)
        return self.o(y.transpose(1, 2).reshape(batch, length, config.n_heads * config.head_dim))


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); the MLP of layer `index` is a mixture of experts where
    `config.moe` names it."""

    def __init__(self, config: DiffusionLMConfig, index: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.rms_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps)
        moe = config.moe if config.moe is not None and index in config.moe.layers else None
        self.mlp = MoE(config.d_model, moe) if moe is not None else GatedMLP(config.d_model, config.mlp_hidden)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], attn_mask: Any,
                cache: tuple[ForwardCache, int, int] | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary, attn_mask, cache)
        return x + self.mlp(self.mlp_norm(x))


def key_padding_keep(attn_mask: Any) -> torch.Tensor | None:
    """The [B, L] real-token mask of a key-padding mask [B, 1, 1, L] (None for any other mask)."""
    if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() == 4 and attn_mask.shape[1:3] == (1, 1):
        return attn_mask[:, 0, 0, :].bool()
    return None


def block_causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, block: int) -> torch.Tensor:
    """Bool [B, 1, Q, K] (True = may attend): a query sees the keys of its own block of `block` positions and of
    every earlier block, blocks counted from absolute position 0 so finished blocks can sit in an exact KV cache
    (positions [B or 1, Q] and [B or 1, K])."""
    return ((query_positions // block)[:, None, :, None] >= (key_positions // block)[:, None, None, :])


class DiffusionLM(nn.Module):
    """Tokens [B, L] (some of them `mask_id`) -> float32 logits [B, L, vocab_size], aligned with the positions."""

    capabilities = frozenset({KV_CACHE, LOGITS_AT})

    def __init__(self, config: DiffusionLMConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_id = config.mask_id
        self.shift = config.shift_logits
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, index) for index in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.rms_eps)
        self.head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        # training: keep only each block's input and recompute the rest in the backward pass (memory for compute)
        self.gradient_checkpointing = False

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def active_parameters(self) -> int:
        """Parameters one token's forward uses: all but the routed experts it is not sent to."""
        moe = self.config.moe
        if moe is None:
            return self.num_parameters()
        idle = (moe.experts - moe.top_k) * moe.expert_parameters(self.config.d_model)
        return self.num_parameters() - idle * sum(isinstance(block.mlp, MoE) for block in self.blocks)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def attention(self) -> AttentionKind:
        """Block-causal with `attention_block` (Fast-dLLM v2, LLaDA2.0), else bidirectional."""
        return "bidirectional" if self.config.attention_block is None else "block_causal"

    @property
    def shifted_logits(self) -> bool:
        """With `shift_logits` (Dream, Fast-dLLM v2) position i's logits are the output at i - 1."""
        return self.shift

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
                cache: ForwardCache | None = None, commit: int = 0, logits_at: slice | None = None) -> torch.Tensor:
        """Logits of `tokens` (only of the columns `logits_at`, if given); other arguments as `hidden`. With
        `shift_logits` the re-alignment is within this call: its first token keeps its own output, so a caller that
        needs token i's prediction queries token i - 1."""
        hidden = self.hidden(tokens, attn_mask, positions, cache, commit)
        first = 0 if logits_at is None else logits_at.start
        if logits_at is not None:  # one column more on the left where the shift reads it
            hidden = hidden[:, first - 1 if self.shift and first > 0 else first: logits_at.stop]
        weight = self.embed.weight if self.head is None else self.head.weight
        logits = F.linear(self.norm(hidden), weight).float()
        if self.shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[:, 1 if first > 0 else 0:]
        return logits

    def positions_for(self, tokens: torch.Tensor, attn_mask: Any, cache: ForwardCache | None) -> torch.Tensor:
        """Default positions: past + 0..L-1 after a cache of `past` tokens; with `pad_positions` and a key-padding
        mask (no cache), counted from each row's first real token, as Dream's sampler counts them."""
        keep = key_padding_keep(attn_mask) if self.config.pad_positions and cache is None else None
        if keep is not None:
            return positions_from(keep).expand(tokens.shape[0], -1)
        past = 0 if cache is None else cache.length
        return torch.arange(past, past + tokens.shape[1], device=tokens.device)[None]

    def hidden(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
               cache: ForwardCache | None = None, commit: int = 0) -> torch.Tensor:
        """The residual stream after the last block [B, L, d_model].

        `attn_mask`: bool, True = may attend, broadcast to [B, heads, L, cache + L] (None: every token sees every
        token). `positions` [B, L] (default: see `positions_for`). With `cache`, its keys and values come first in
        the key sequence, and the first `commit` tokens of this call are appended to it. With `attention_block`,
        a key-padding mask (or none) is combined with the block-causal mask, the cache taken to hold positions
        0..T-1 as the default positions fill it; any other mask is the caller's whole pattern.
        """
        if self.config.attend_padding and key_padding_keep(attn_mask) is not None:
            attn_mask = None  # the model's own code attends to padding
        if positions is None:
            positions = self.positions_for(tokens, attn_mask, cache)
        block = self.config.attention_block
        if block is not None and (attn_mask is None or key_padding_keep(attn_mask) is not None):
            past = torch.arange(0 if cache is None else cache.length, device=tokens.device)
            keys = torch.cat([past[None].expand(positions.shape[0], -1), positions], 1)
            causal = block_causal_mask(positions, keys, block)
            attn_mask = causal if attn_mask is None else causal & attn_mask.bool()
        top = int(positions.max()) + 1
        if top > self.config.max_positions:
            raise ValueError(f"position {top - 1} exceeds the model's {self.config.max_positions} positions")
        rounded = self.embed.weight.dtype if self.config.rotary_freqs_rounded else torch.float32
        rotary = rotary_angles(positions, self.config.rotated_dims, self.config.rope_theta, rounded)
        x = self.embed(tokens)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for index, layer in enumerate(self.blocks):
            if recompute:
                x = checkpoint(layer, x, rotary, attn_mask, None, use_reentrant=False)
            else:
                x = layer(x, rotary, attn_mask, None if cache is None else (cache, index, commit))
        return x

"""A bidirectional, time-agnostic transformer for masked diffusion (nanoGPT-sized, readable in one sitting).

No time embedding: a masked diffusion model can infer the noise level from the number of mask tokens,
so, as in the EB-Sampler paper's small DiT, the network maps a partially masked sequence to logits only.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, fields
from typing import Any, ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from mdmkit.core.config import Validated, require
from mdmkit.models.denoiser import HIDDEN_STATES, KV_CACHE, AttentionKind, ForwardCache


@dataclass
class TransformerShape(Validated):
    """What every block of a network shares; `vocab_size` and `max_len` come from the task. A subclass adds
    its depth: fields named in `layer_counts`, which come right after `max_len` (the rest is keyword-only)."""

    layer_counts: ClassVar[tuple[str, ...]] = ()

    vocab_size: int
    max_len: int
    _: KW_ONLY
    d_model: int = 128
    n_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    positions: Literal["learned", "rotary"] = "learned"

    def validate(self) -> None:
        for name in ("vocab_size", "max_len", *self.layer_counts, "d_model", "n_heads"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        require(self.d_model % self.n_heads == 0, f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        require(self.mlp_ratio > 0, f"mlp_ratio={self.mlp_ratio} must be > 0")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")
        if self.positions == "rotary":
            require((self.d_model // self.n_heads) % 2 == 0, "rotary positions need an even head dimension")

    def with_layers(self, n_layers: int) -> TransformerConfig:
        """A plain transformer of this shape, `n_layers` blocks deep."""
        shape = {field.name: getattr(self, field.name) for field in fields(TransformerShape)}
        return TransformerConfig(**shape, n_layers=n_layers)


@dataclass
class TransformerConfig(TransformerShape):
    """Shape of the network: `n_layers` blocks of the shared `TransformerShape`."""

    layer_counts: ClassVar[tuple[str, ...]] = ("n_layers",)

    n_layers: int = 4

    def build(self) -> MaskedTransformer:
        return MaskedTransformer(self)


class Rotation(Protocol):
    """Rotates queries or keys [B, H, L, D] by their positions: `Rotary`, or the speculative network's two-position
    `SplitRotary`."""

    def __call__(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor: ...


class Rotary(nn.Module):
    """Rotary position embedding applied to queries and keys (rotate-half convention)."""

    cos: torch.Tensor  # buffers [max_len, head_dim]
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)
        self.register_buffer("cos", angles.cos().repeat(1, 2), persistent=False)
        self.register_buffer("sin", angles.sin().repeat(1, 2), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, H, L, D]; `positions` [B, L] (default 0..L-1) lets tokens share or skip positions."""
        if positions is None:
            cos, sin = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        else:
            cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig, rotary: Rotation | None) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.dropout
        self.rotary = rotary

    def forward(self, x: torch.Tensor, attn_mask: Any, positions: torch.Tensor | None = None,
                cache: tuple[ForwardCache, int, int] | None = None) -> torch.Tensor:
        """`attn_mask`: None, a bool tensor (True = may attend) or a FlexAttention BlockMask.

        `cache` = (cache, layer index, commit): keys/values of earlier tokens come first in the key sequence.
        """
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        if self.rotary is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if cache is not None:
            store, layer, commit = cache
            k, v = store.attend(layer, k, v, commit)
        if isinstance(attn_mask, BlockMask):
            y = flex_attention(q, k, v, block_mask=attn_mask)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
            )
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, config: TransformerConfig, rotary: Rotation | None) -> None:
        super().__init__()
        hidden = int(config.mlp_ratio * config.d_model)
        self.norm_attn = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config, rotary)
        self.norm_mlp = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model), nn.Dropout(config.dropout)
        )

    def forward(self, x: torch.Tensor, attn_mask: Any, positions: torch.Tensor | None = None,
                cache: tuple[ForwardCache, int, int] | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x), attn_mask, positions, cache)
        return x + self.mlp(self.norm_mlp(x))


class MaskedTransformer(nn.Module):
    """Maps tokens [B, L] (some of them the mask token) to logits [B, L, vocab_size]."""

    capabilities = frozenset({KV_CACHE, HIDDEN_STATES})
    attention: AttentionKind = "bidirectional"  # without a mask (`attn_mask` makes it causal for NTP, or between)
    shifted_logits = False

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        head_dim = config.d_model // config.n_heads
        rotary = Rotary(head_dim, config.max_len) if config.positions == "rotary" else None
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_len, config.d_model) if rotary is None else None
        self.blocks = nn.ModuleList(Block(config, rotary) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
                cache: ForwardCache | None = None, commit: int = 0) -> torch.Tensor:
        """Logits [B, L, vocab] of `tokens` [B, L]: the head on `hidden` (same arguments)."""
        return self.head(self.norm(self.hidden(tokens, attn_mask, positions, cache, commit)))

    def forward_with_hidden(self, tokens: torch.Tensor, attn_mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the final-normed hidden state [B, L, d_model] they are read from, in one forward."""
        hidden = self.norm(self.hidden(tokens, attn_mask))
        return self.head(hidden), hidden

    def hidden(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
               cache: ForwardCache | None = None, commit: int = 0) -> torch.Tensor:
        """The residual stream after the last block [B, L, d_model], which the head reads.

        `attn_mask` (bool, True = may attend, broadcast to [B, heads, L, cache + L]; or a BlockMask) makes
        the same network bidirectional (MDM), causal (NTP) or anything between (SBD). `positions` [B, L]
        gives each token its position (default 0..L-1). With `cache`, earlier tokens' keys and values are attended to
        first, and the first `commit` tokens of this call are appended to it.
        """
        length = tokens.shape[1]
        top = length if positions is None else int(positions.max()) + 1
        if top > self.config.max_len:
            raise ValueError(f"sequence length {top} exceeds the model's max_len={self.config.max_len}")
        x = self.embed(tokens)
        if self.position is not None:
            x = x + (self.position.weight[:length] if positions is None else self.position(positions))
        for index, block in enumerate(self.blocks):
            x = block(x, attn_mask, positions, None if cache is None else (cache, index, commit))
        return x

"""mdmkit's transformer for uniform-noise diffusion: it reads the previous step's logits and which positions it fills.

A uniform-noise canvas has no mask token, so the network cannot tell a given from a noisy guess by its token: a
learned embedding marks the positions to fill, as DiffusionGemma's encoder / decoder split does. The previous step's
logits come in as their expected token embedding (softmax @ embedding) through a small MLP (self-conditioning; a
row without them gets the MLP of zeros, as DiffusionGemma's zeroed signal). Behind the `canvas` capability the whole
sequence is one in-place canvas: `open` takes the rows with their givens, and `decode` keeps every given (its logits
pinned to it), so a revisable sampler revises only the positions to fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import CANVAS
from mdmkit.models.transformer import MaskedTransformer, TransformerConfig

PINNED = -1.0e4  # logit of every other token at a given position: a probability of exactly 0 in float32


def pin_givens(logits: torch.Tensor, tokens: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """`logits` [B, L, V] with every position outside `fill` [B, L] certain of its token in `tokens`, so that a
    given is never redrawn, has entropy 0, and reaches self-conditioning as what it is (training and decoding alike)."""
    pinned = torch.full_like(logits, PINNED).scatter_(-1, tokens[..., None], 0.0)
    return torch.where(fill[..., None], logits, pinned)


@dataclass
class SelfConditionedConfig(TransformerConfig):
    """A `TransformerConfig` whose network also reads the previous step's logits and the positions to fill: what
    `UniformDiffusionLoss` trains and `RevisableSampler` decodes (its defaults are the CPU model's shape)."""

    def build(self) -> SelfConditionedTransformer:
        return SelfConditionedTransformer(self)


@dataclass
class InPlace:
    """A batch's canvas state: its rows (givens in place) and where to fill."""

    tokens: torch.Tensor  # [B, L]
    fill: torch.Tensor  # [B, L] bool


class SelfConditionedTransformer(MaskedTransformer):
    """tokens [B, L], the previous step's logits [B, L, V] (or None) and the positions to fill [B, L] -> logits."""

    capabilities = frozenset({CANVAS})

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        width, hidden = config.d_model, int(config.mlp_ratio * config.d_model)
        self.fill_embed = nn.Embedding(2, width)  # 0: a given, 1: a position to fill
        self.condition = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                                       nn.Linear(hidden, width))
        for module in (self.fill_embed, *self.condition):
            self._init_weights(module)

    # its own inputs, not a Denoiser's: masked samplers never run it (its only capability is `canvas`)
    def forward(self, tokens: torch.Tensor,  # type: ignore[override]
                self_conditioning: torch.Tensor | None = None, fill: torch.Tensor | None = None,
                conditioned: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, L, V]. `fill` [B, L] (None: every position); `conditioned` [B] bool: the rows whose
        `self_conditioning` is read (None: every row when it is given); the others get the signal of zeros."""
        length = tokens.shape[1]
        if length > self.config.max_len:
            raise ValueError(f"sequence length {length} exceeds the model's max_len={self.config.max_len}")
        x = self.embed(tokens)
        fill = torch.ones_like(tokens, dtype=torch.bool) if fill is None else fill
        x = x + self.fill_embed(fill.long())
        soft = x.new_zeros(x.shape)
        if self_conditioning is not None:
            soft = torch.softmax(self_conditioning.float(), dim=-1).to(x.dtype) @ self.embed.weight
            if conditioned is not None:
                soft = soft * conditioned.to(x.dtype)[:, None, None]
        x = x + self.condition(soft)
        if self.position is not None:
            x = x + self.position.weight[:length]
        for block in self.blocks:
            x = block(x, None)
        return self.head(self.norm(x))

    @property
    def canvas(self) -> CanvasSpec:
        """One in-place canvas over the whole sequence; noise ranges over the whole vocabulary, as in training."""
        return CanvasSpec(self.config.max_len, self.config.vocab_size, (), None, in_place=True)

    def open(self, prompt: torch.Tensor, keep: torch.Tensor | None) -> InPlace:
        """`prompt`: the rows [B, L], givens in place; `keep` [B, L]: True at the givens (None: nothing to fill)."""
        return InPlace(prompt, torch.zeros_like(prompt, dtype=torch.bool) if keep is None else ~keep)

    def encode(self, state: Any, tokens: torch.Tensor) -> None:
        """Nothing to encode: the givens sit in the canvas itself."""

    def decode(self, state: InPlace, canvas: torch.Tensor, self_conditioning: torch.Tensor | None,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        tokens, fill = (state.tokens, state.fill) if rows is None else (state.tokens[rows], state.fill[rows])
        logits = self(torch.where(fill, canvas, tokens), self_conditioning, fill).float()
        return pin_givens(logits, tokens, fill)

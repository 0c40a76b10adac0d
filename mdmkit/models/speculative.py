"""The hybrid network of "Self-Speculative Masked Diffusions" (§3.1, Figure 1).

A standard MDM (the non-causal trunk, a `MaskedTransformer`) is followed by causal blocks that run on the
sequence permuted into an order σ, σ-GPT style. Track i of the causal blocks carries the token at σ(i),
the positions σ(i) and σ(i+1) (two learned tables, or rotary channels split between the two as in Appendix
E.3) and the trunk's hidden states at σ(i) and σ(i+1); it predicts the token at σ(i+1) from the trunk's
hidden state there plus its own correction (the output residual). The correction's output projection starts
at zero, so an untrained head, or one added to a trained MDM, reproduces that MDM exactly: the causal loss
starts equal to the non-causal one and training moves it only where the extra context helps.

`order` always lists first the positions the trunk saw (not masked), then the masked ones in generation order.
The first masked position has no earlier masked token to learn from, so its target is the draft itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from mdmkit.core.config import require
from mdmkit.models.denoiser import CAUSAL_HEAD, AttentionKind
from mdmkit.models.transformer import Block, MaskedTransformer, Rotary, TransformerShape


@dataclass
class SpeculativeConfig(TransformerShape):
    """`n_noncausal` trunk blocks, then `n_causal` causal blocks, all of the shared `TransformerShape`.
    `freeze_noncausal` trains the causal blocks only (start from a trained MDM with `init_from=<mdm.pt>`)."""

    layer_counts: ClassVar[tuple[str, ...]] = ("n_noncausal", "n_causal")

    n_noncausal: int = 3
    n_causal: int = 1
    freeze_noncausal: bool = field(default=False, kw_only=True)

    def validate(self) -> None:
        super().validate()
        if self.positions == "rotary":
            require((self.d_model // self.n_heads) % 4 == 0, "rotary causal blocks split each head between "
                    "two positions: the head dimension (d_model / n_heads) must be a multiple of 4")

    def build(self) -> SpeculativeTransformer:
        return SpeculativeTransformer(self)


class Trunk(NamedTuple):
    """One non-causal pass: last hidden states [B, L, d_model] and draft logits [B, L, V]."""

    hidden: torch.Tensor
    logits: torch.Tensor

    def select(self, rows: torch.Tensor) -> Trunk:
        return Trunk(self.hidden[rows], self.logits[rows])


class SplitRotary(nn.Module):
    """Rotary embedding of two positions per track: the first half of each head rotates by the track's own
    position, the second half by the next position in σ (Appendix E.3). `positions` is [B, 2, L]."""

    def __init__(self, head_dim: int, max_len: int) -> None:
        super().__init__()
        self.rotary = Rotary(head_dim // 2, max_len)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        here, following = x.chunk(2, dim=-1)
        return torch.cat([self.rotary(here, positions[:, 0]), self.rotary(following, positions[:, 1])], -1)


def gather_positions(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, L, D] gathered along L by index [B, L']."""
    return values.gather(1, index[..., None].expand(-1, -1, values.shape[-1]))


class SpeculativeTransformer(nn.Module):
    """Non-causal trunk (draft) + causal blocks over σ (target). `forward` is the trunk alone, so every MDM
    sampler runs on this network unchanged: that is the same-architecture MDM baseline."""

    capabilities = frozenset({CAUSAL_HEAD})
    attention: AttentionKind = "bidirectional"  # the trunk's, which `forward` is
    shifted_logits = False

    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__()
        self.config = config
        self.trunk = MaskedTransformer(config.with_layers(config.n_noncausal))
        causal = config.with_layers(config.n_causal)
        d_model, head_dim = config.d_model, config.d_model // config.n_heads
        rotary = SplitRotary(head_dim, config.max_len) if config.positions == "rotary" else None
        self.here = nn.Embedding(config.max_len, d_model) if rotary is None else None
        self.next = nn.Embedding(config.max_len, d_model) if rotary is None else None
        self.hidden_norm = nn.LayerNorm(d_model)
        self.inputs = nn.Linear(3 * d_model, d_model)  # [token, hidden here, hidden next] -> track input
        self.blocks = nn.ModuleList(Block(causal, rotary) for _ in range(config.n_causal))
        self.out_norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, d_model)
        for module in (self.here, self.next, self.inputs, self.out):
            if module is not None:
                MaskedTransformer._init_weights(module)
        for block in self.blocks:
            block.apply(MaskedTransformer._init_weights)
        nn.init.zeros_(self.out.weight)  # the target starts as the draft (see the module docstring)
        if config.freeze_noncausal:
            self.trunk.requires_grad_(False)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def n_layers(self) -> int:
        return self.config.n_noncausal + self.config.n_causal

    @property
    def causal_share(self) -> float:
        """Cost of one pass of the causal blocks in full forwards (§5.1: 1 of 12 blocks costs 1/12)."""
        return self.config.n_causal / self.n_layers

    def noncausal(self, tokens: torch.Tensor, attn_mask: Any = None) -> Trunk:
        """The trunk's last hidden states [B, L, d_model] and its draft logits [B, L, V]."""
        x = self.trunk.hidden(tokens, attn_mask)
        return Trunk(x, self.trunk.head(self.trunk.norm(x)))

    def causal(self, trunk: Trunk, tokens: torch.Tensor, order: torch.Tensor,
               n_known: torch.Tensor) -> torch.Tensor:
        """Target logits [B, L, V] by position.

        `tokens` [B, L] hold a value at every position (the causal blocks see them in σ order), `order` [B, L]
        is σ and the first `n_known` [B] positions of it are those the trunk saw. The target at σ(j) depends
        on the trunk and on tokens at σ(<j) only; at σ(n_known) and at the known positions it is the draft.
        """
        length = tokens.shape[1]
        following = torch.cat([order[:, 1:], order[:, -1:]], 1)  # what each track predicts (the last: unused)
        hidden = self.hidden_norm(trunk.hidden)
        x = self.inputs(torch.cat([self.trunk.embed(tokens.gather(1, order)), gather_positions(hidden, order),
                                   gather_positions(hidden, following)], -1))
        positions = None
        if self.here is not None and self.next is not None:
            x = x + self.here(order) + self.next(following)
        else:
            positions = torch.stack([order, following], 1)
        track = torch.arange(length, device=tokens.device)
        causal = track[None, :] <= track[:, None]
        for block in self.blocks:
            x = block(x, causal, positions)
        stream = gather_positions(trunk.hidden, following) + self.out(self.out_norm(x))  # the output residual
        predicted = self.trunk.head(self.trunk.norm(stream))
        scored = (track[None, :] >= n_known[:, None]) & (track[None, :] < length - 1)
        rows, tracks = scored.nonzero(as_tuple=True)
        target = trunk.logits.clone()
        target[rows, following[rows, tracks]] = predicted[rows, tracks]
        return target

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None, return_trunk: bool = False) -> Any:
        """Draft logits [B, L, V] (an MDM's output), or the whole `Trunk` for the speculative sampler."""
        trunk = self.noncausal(tokens, attn_mask)
        return trunk if return_trunk else trunk.logits

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        """A `MaskedTransformer`'s weights load into the trunk, the causal blocks staying as they are: this is
        how `init_from=<a trained MDM>` starts a hybrid from that MDM."""
        if any(key.startswith("trunk.") for key in state_dict):
            return super().load_state_dict(state_dict, strict, assign)
        return self.trunk.load_state_dict(state_dict, strict, assign)

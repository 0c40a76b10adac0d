"""The neural indicator: a position-level MLP that says which masked positions can be revealed now.

Each masked position is judged on its own (no cross-position interaction: the base network's last hidden state
already carries the sequence context) from three features of the base network's forward pass:

- the input embeddings of its top-K1 predicted tokens (top-1 is the token it would get, the rest its rivals);
- the last hidden state, the input of the output head;
- the top-K2 predicted probabilities (the confidence that threshold rules look at).

Each feature has its own input layer, then residual MLP blocks and a two-class head; the positive-class log-odds is
the score the NI sampler thresholds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import nn

from mdmkit.core.config import Validated, require
from mdmkit.models.denoiser import HiddenStateDenoiser

_LOG_FLOOR = 1e-9  # probabilities enter the MLP also as logs, floored so that a zero is finite


@dataclass
class Features:
    """An indicator's input for positions [...]: [R, L] from a sampling step, [N] selected positions."""

    token_embeddings: torch.Tensor  # [..., K1, D] base input embeddings of the top-K1 predicted tokens
    hidden: torch.Tensor  # [..., D] the base network's last hidden state
    top_probs: torch.Tensor  # [..., K2] the K2 largest predicted probabilities, descending


def features(
    embedding: nn.Embedding, logits: torch.Tensor, hidden: torch.Tensor, top_tokens: int, top_probs: int
) -> Features:
    """Features of positions [...] from one forward: `logits` [..., V] (mask excluded), `hidden` [..., D].

    In float32 whatever the base network's precision, so one indicator serves both.
    """
    tokens = logits.topk(top_tokens, dim=-1).indices
    probs = logits.float().softmax(-1).topk(top_probs, dim=-1).values
    return Features(embedding(tokens).float(), hidden.float(), probs)


def network_fingerprint(network: HiddenStateDenoiser) -> str:
    """A hash of the base network's input embeddings: an indicator only fits the network it was trained on."""
    weight = network.embed.weight.detach().to("cpu", torch.float32).contiguous()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()[:16]


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclass
class IndicatorConfig(Validated):
    """Shape of the indicator MLP (config group `indicator`)."""

    top_tokens: int = 4  # K1
    top_probs: int = 8  # K2
    width: int = 64
    n_blocks: int = 2  # residual blocks: x + W2 GELU(W1 LN(x))
    dropout: float = 0.0

    def validate(self) -> None:
        for name in ("top_tokens", "top_probs", "width"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        require(self.n_blocks >= 0, f"n_blocks={self.n_blocks} must be >= 0")
        require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")

    def build(self, d_model: int, vocab_size: int) -> Indicator:
        """The indicator for a base network of width `d_model` over `vocab_size` tokens (one is the mask)."""
        for name in ("top_tokens", "top_probs"):
            require(getattr(self, name) <= vocab_size - 1,
                    f"{name}={getattr(self, name)} exceeds the {vocab_size - 1} predictable tokens")
        return Indicator(self, d_model)


class _Residual(nn.Module):
    """x + W2 GELU(W1 LN(x))."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Indicator(nn.Module):
    """Features [...] -> two-class logits [..., 2] (class 1: the position can be revealed now)."""

    def __init__(self, config: IndicatorConfig, d_model: int) -> None:
        super().__init__()
        self.config, self.d_model = config, d_model
        width = config.width
        self.tokens_in = nn.Linear(config.top_tokens * d_model, width)
        self.hidden_in = nn.Linear(d_model, width)
        self.probs_in = nn.Linear(2 * config.top_probs, width)  # probabilities and their logs
        self.mix = nn.Linear(3 * width, width)
        self.blocks = nn.Sequential(*(_Residual(width, config.dropout) for _ in range(config.n_blocks)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2)

    def forward(self, features: Features) -> torch.Tensor:
        probs = features.top_probs
        parts = (
            self.tokens_in(features.token_embeddings.flatten(-2)),
            self.hidden_in(features.hidden),
            self.probs_in(torch.cat([probs, probs.clamp_min(_LOG_FLOOR).log()], -1)),
        )
        x = self.mix(torch.nn.functional.gelu(torch.cat(parts, -1)))
        return self.head(self.norm(self.blocks(x)))

    def log_odds(self, features: Features) -> torch.Tensor:
        """log p(1) - log p(0) per position: score >= eps exactly when log-odds >= log(eps / (1 - eps))."""
        logits = self.forward(features)
        return logits[..., 1] - logits[..., 0]


class IndicatorScorer:
    """A trained indicator as the NI sampler calls it: (masked, logits, hidden) -> log-odds [R, L].

    Only masked positions are scored (the rest get -inf); `embedding` is the base network's input embedding.
    """

    def __init__(self, indicator: Indicator, embedding: nn.Embedding) -> None:
        self.indicator, self.embedding = indicator, embedding

    def __call__(self, masked: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        config = self.indicator.config
        inputs = features(self.embedding, logits[masked], hidden[masked], config.top_tokens, config.top_probs)
        scores = torch.full(masked.shape, float("-inf"), device=logits.device)
        scores[masked] = self.indicator.log_odds(inputs).float()
        return scores

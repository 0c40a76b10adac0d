"""Shared test networks: a small seeded random transformer, toy denoisers whose logits are fixed tables
(known exactly, whatever the input) that record what they were given in `seen`, and a toy whose predictions
depend on which positions are revealed; and the masked rows the rule samplers' tests fill."""

from __future__ import annotations

from typing import Any

import torch

from mdmkit.models import MaskedTransformer, TransformerConfig
from mdmkit.models.denoiser import CAUSAL_HEAD
from mdmkit.models.speculative import Trunk


def random_transformer(vocab_size: int, max_len: int, seed: int | None = 0, *, n_layers: int = 2,
                       d_model: int = 32, n_heads: int = 2, head_scale: float | None = None,
                       **config: Any) -> MaskedTransformer:
    """A small random transformer in eval mode. The global RNG is seeded with `seed` right before the build, so
    its weights, and whatever a test draws from the global RNG afterwards, are the same on every run; with
    `seed=None` it is left as it is (for tests whose outcome holds for any weights).

    `head_scale` multiplies the output head (confidences then differ clearly between positions); `config`
    passes further `TransformerConfig` fields (e.g. `positions`).
    """
    if seed is not None:
        torch.manual_seed(seed)
    net = TransformerConfig(vocab_size=vocab_size, max_len=max_len, n_layers=n_layers, d_model=d_model,
                            n_heads=n_heads, **config).build().eval()
    if head_scale is not None:
        with torch.no_grad():
            net.head.weight.mul_(head_scale)
    return net


def masked_rows(rows: int = 6, seed: int = 0, *, length: int, mask_id: int) -> torch.Tensor:
    """`rows` seeded rows of tokens below `mask_id`, row r with 4 + r of its `length` positions masked at random
    places (rows differ in how much is left to fill, so a batch's rows finish at different steps)."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.randint(0, mask_id, (rows, length), generator=generator)
    for row in range(rows):
        out[row, torch.randperm(length, generator=generator)[: 4 + row]] = mask_id
    return out


class FixedLogits(torch.nn.Module):
    """Position i has the logits `logits[i]` [L, V] whatever the input; records every input in `seen`."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.seen: list[Any] = []

    def batch(self, tokens: torch.Tensor) -> torch.Tensor:
        """The table once for every row of `tokens` [B, L]: [B, L, V]."""
        return self.logits.expand(tokens.shape[0], -1, -1)

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.seen.append(tokens.clone())
        return self.batch(tokens)


class FixedConfidence(FixedLogits):
    """Position i predicts token i % (vocab - 1) with probability conf[i], the other real tokens sharing the
    rest equally, the mask (the last token, vocab - 1) never.

    With `unmasked_token`, a position that is not masked in the input predicts that token instead.
    """

    def __init__(self, conf: list[float], unmasked_token: int | None = None, vocab: int = 6) -> None:
        super().__init__(torch.stack([self._row(c, i % (vocab - 1), vocab) for i, c in enumerate(conf)]))
        self.mask_id = vocab - 1
        rows = None if unmasked_token is None else [self._row(c, unmasked_token, vocab) for c in conf]
        self.unmasked = None if rows is None else torch.stack(rows)

    @staticmethod
    def _row(c: float, token: int, vocab: int) -> torch.Tensor:
        probs = torch.full((vocab,), (1 - c) / (vocab - 2))
        probs[token], probs[vocab - 1] = c, 0.0
        return probs.clamp_min(1e-9).log()

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = super().forward(tokens)
        if self.unmasked is None:
            return logits
        return torch.where((tokens == self.mask_id)[..., None], logits, self.unmasked)


class Independent(FixedLogits):
    """Every position i has the fixed distribution probs[i] over the real tokens, whatever the input (a
    factorized joint); the mask token, column `mask_id` of the logits, is never predicted."""

    def __init__(self, probs: torch.Tensor, mask_id: int) -> None:
        logits = probs.clamp_min(1e-12).log()
        never = torch.full((len(probs), 1), -1e9)
        super().__init__(torch.cat([logits[:, :mask_id], never, logits[:, mask_id:]], 1))


class LeftToRight(FixedLogits):
    """Predicts `target` with confidence decreasing left to right, so Top-1 decodes in reading order (the last
    of the `vocab` tokens is the mask)."""

    def __init__(self, target: list[int], vocab: int) -> None:
        logits = torch.full((len(target), vocab), -1e9)
        for pos, token in enumerate(target):
            logits[pos, :-1] = 0.0
            logits[pos, token] = 10.0 - pos * 0.5
        super().__init__(logits)


class HybridTable(FixedLogits):
    """A hand-made self-speculative hybrid: the draft of each position is a fixed row of `draft`; the target is
    `target` at every position after σ(n_known), the draft elsewhere (the contract of `causal`). Records the
    inputs of its causal calls (tokens, order) in `seen`, not those of its drafts."""

    causal_share = 0.25
    capabilities = frozenset({CAUSAL_HEAD})

    def __init__(self, draft: list[list[float]], target: list[float]) -> None:
        super().__init__(torch.tensor(draft).log())
        self.target = torch.tensor(target).log()

    def forward(self, tokens: torch.Tensor, return_trunk: bool = False) -> torch.Tensor | Trunk:
        trunk = Trunk(torch.zeros(*tokens.shape, 1), self.batch(tokens))
        return trunk if return_trunk else trunk.logits

    def noncausal(self, tokens: torch.Tensor) -> Trunk:
        return self(tokens, return_trunk=True)

    def causal(self, trunk: Trunk, tokens: torch.Tensor, order: torch.Tensor,
               n_known: torch.Tensor) -> torch.Tensor:
        self.seen.append((tokens.tolist(), order.tolist()))
        later = order.argsort(1) > n_known[:, None]
        return torch.where(later[..., None], self.target, trunk.logits)


# A worked example for `Dependent`: 1, 3, 6 are always right; 5 needs 3 revealed, 2 needs 5, 4 needs 2.
TARGET = [1, 2, 3, 4, 0, 2, 3]
DEPS = {5: [3], 2: [5], 4: [2]}


class Dependent(torch.nn.Module):
    """Position i predicts target[i] once every position in deps[i] is revealed, else a wrong token.

    Logits are one-hot (scaled) over `vocab` tokens, the last of which is the mask; `mask_bias` puts the highest
    logit on the mask token everywhere, which an oracle must ignore. Records the batch size of every call.
    """

    def __init__(self, target: list[int], deps: dict[int, list[int]], mask_bias: bool = False,
                 vocab: int = 6) -> None:
        super().__init__()
        length = len(target)
        self.vocab, self.mask_id = vocab, vocab - 1
        self.target = torch.tensor(target)
        self.wrong = (self.target + 1) % self.mask_id  # never the target, never the mask token
        self.deps = torch.zeros(length, length, dtype=torch.bool)
        for i, needs in deps.items():
            self.deps[i, needs] = True
        self.mask_bias = mask_bias
        self.calls: list[int] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls.append(tokens.shape[0])
        hidden = tokens == self.mask_id  # [B, L]
        ready = ~(self.deps[None] & hidden[:, None, :]).any(-1)  # [B, L]
        predicted = torch.where(ready, self.target, self.wrong)
        logits = torch.nn.functional.one_hot(predicted, self.vocab).float() * 10.0
        if self.mask_bias:
            logits[..., self.mask_id] = 100.0
        return logits

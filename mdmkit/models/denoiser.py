"""What a sampler may ask of a network: the `Denoiser` protocol and its optional capabilities.

Every network maps partially masked sequences to logits, which is all most samplers need. Each further need is a
named capability (the protocols below, and `logits_at`: the forward computes the output layer only on a column
slice, since at a large vocabulary it and its float32 copy are a step's largest tensors). A network class declares
its `capabilities`, a sampler lists its `requires`; `require_capabilities` refuses a mismatch in one line before
any forward, and the forward counter exposes exactly these operations, each charged. How a network attends and
where its logits sit (`AttentionPattern`) and what a cache must offer a forward (`ForwardCache`) are protocols too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from mdmkit.core.errors import CapabilityError

KV_CACHE = "kv_cache"
HIDDEN_STATES = "hidden_states"
CAUSAL_HEAD = "causal_head"
LOGITS_AT = "logits_at"
CANVAS = "canvas"
CAPABILITIES = {
    KV_CACHE: "incremental decoding with a KV cache",
    HIDDEN_STATES: "last hidden states and input embeddings",
    CAUSAL_HEAD: "causal blocks that verify drafts (a SpeculativeTransformer)",
    LOGITS_AT: "logits of chosen columns only",
    CANVAS: "revisable canvases: an encoder KV cache and a canvas decoder (models/canvas.py)",
}
AttentionKind = Literal["bidirectional", "block_causal", "causal"]


@runtime_checkable
class AttentionPattern(Protocol):
    """Declared by every network class: how its tokens attend without an explicit mask (`block_causal`: blocks
    counted from absolute position 0, each seeing itself and those before it) and whether its logits at position i
    come from its output at i - 1 (`shifted_logits`, Dream's layout). Caches depend on both: a block-causal network's
    finished blocks are cached exactly, and a shifted network's cached query window starts one position early. A
    network that declares neither is taken as bidirectional and unshifted."""

    @property
    def attention(self) -> AttentionKind: ...

    @property
    def shifted_logits(self) -> bool: ...


class ForwardCache(Protocol):
    """What a forward reads of a cache: how many cached positions precede its tokens, and per layer the keys and
    values its tokens attend to, given theirs. Which of theirs are kept is the cache's own rule: `KVCache` appends
    the first `commit`, `CacheWindow` overwrites a window in place, block diffusion's column cache writes as planned."""

    @property
    def length(self) -> int: ...

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               commit: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class KVCache:
    """Keys and values of already-processed tokens, per layer [B, H, T, D], for incremental decoding.

    A forward given a cache attends to it before its own tokens; with `commit=n` it also appends the keys and
    values of its first n tokens (the rest are queries only, e.g. a block of masks that will change).
    """

    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]

    @classmethod
    def empty(cls, n_layers: int) -> KVCache:
        return cls([None] * n_layers, [None] * n_layers)

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor, commit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, T + L, D] a layer's new tokens (`k`, `v` [B, H, L, D]) attend to: this cache's
        first, then theirs; the first `commit` of the new ones are appended to the cache."""
        cached_k, cached_v = self.keys[layer], self.values[layer]
        past = 0 if cached_k is None else cached_k.shape[2]
        if past and cached_k is not None and cached_v is not None:
            k, v = torch.cat([cached_k, k], 2), torch.cat([cached_v, v], 2)
        if commit:
            self.keys[layer], self.values[layer] = k[:, :, : past + commit], v[:, :, : past + commit]
        return k, v

    def select(self, rows: torch.Tensor) -> KVCache:
        """The cache of a subset of rows (a copy: forwards on it cannot commit to this cache)."""
        pick = lambda t: None if t is None else t[rows]
        return KVCache([pick(k) for k in self.keys], [pick(v) for v in self.values])


@dataclass
class CacheWindow:
    """A `KVCache` as a forward over its positions [at, at + L) sees it: the forward's keys and values replace the
    cached ones there, in place, and it attends to the whole cache with no mask (so on the fused kernels). For the
    approximate caches, whose window entries are stale (Fast-dLLM's dual cache writes its block the same way)."""

    store: KVCache
    at: int

    @property
    def length(self) -> int:
        return self.at

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor, commit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, T, D] of the whole cache, the window's rewritten (`commit` changes nothing: the
        window's entries are written either way)."""
        keys, values = self.store.keys[layer], self.store.values[layer]
        assert keys is not None and values is not None, "a window needs a written cache"
        keys[:, :, self.at: self.at + k.shape[2]] = k
        values[:, :, self.at: self.at + v.shape[2]] = v
        return keys, values


class Denoiser(Protocol):
    """Tokens [B, L] (some of them the mask token) -> logits [B, L, V]; `attn_mask` hides padding."""

    def __call__(self, tokens: torch.Tensor, attn_mask: Any = None) -> torch.Tensor: ...


class CachedDenoiser(Denoiser, Protocol):
    """Capability `kv_cache`: `attn_mask` spans the cached entries, then this call's tokens. Causal decoding (NTP,
    SBD) needs it; the approximate prefix and dual caches (`samplers/core/kv_cache.py`) need nothing more: they
    commit the whole canvas once per block and hide, through `attn_mask`, the entries a query may not use."""

    @property
    def n_layers(self) -> int: ...

    def __call__(self, tokens: torch.Tensor, attn_mask: Any = None, positions: torch.Tensor | None = None,
                 cache: ForwardCache | None = None, commit: int = 0) -> torch.Tensor: ...


class HiddenStateDenoiser(Denoiser, Protocol):
    """Capability `hidden_states`: the last hidden state of the same forward and the input embedding, which NI
    sampling's indicator reads."""

    embed: torch.nn.Embedding

    def forward_with_hidden(self, tokens: torch.Tensor,
                            attn_mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class SelfSpeculativeDenoiser(Denoiser, Protocol):
    """Capability `causal_head`: the self-speculative hybrid's trunk pass and its causal verification pass (costing
    `causal_share` of a forward)."""

    causal_share: float

    def noncausal(self, tokens: torch.Tensor, attn_mask: Any = None) -> Any: ...

    def causal(self, trunk: Any, tokens: torch.Tensor, order: torch.Tensor,
               n_known: torch.Tensor) -> torch.Tensor: ...


def positions_from(keep: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token, so left padding does not shift them."""
    return (keep.long().cumsum(1) - 1).clamp(min=0)


def without_mask(logits: torch.Tensor, mask_id: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits in `dtype` with the mask token ruled out, as samplers see them (it is never a prediction)."""
    return logits.to(dtype).index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))


def missing_capability(network: object, capability: str) -> CapabilityError:
    """The error for asking `network` for a `capability` it does not declare."""
    return CapabilityError(f"{type(network).__name__} does not provide {capability} ({CAPABILITIES[capability]})")


def capabilities_of(network: object) -> frozenset[str]:
    """The capabilities `network` declares (none for a plain callable)."""
    return frozenset(getattr(network, "capabilities", ()))


def require_capabilities(sampler: object, network: object) -> None:
    """Refuse, in one line, a sampler that needs a capability `network` lacks."""
    missing = sorted(frozenset(getattr(sampler, "requires", ())) - capabilities_of(network))
    if missing:
        needs = "; ".join(f"{name} ({CAPABILITIES[name]})" for name in missing)
        raise CapabilityError(f"sampler {type(sampler).__name__} needs {needs}, which {type(network).__name__} "
                          f"does not provide")

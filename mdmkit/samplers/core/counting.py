"""Honest cost accounting: NFE is counted from real forward passes, per sample.

A forward of the main network costs 1 for every row it ran on, whatever its width (`tokens` keeps the widths,
padding included: a cached forward runs fewer). Cheaper passes (a planner, an indicator MLP, a partial stack of
layers) are charged at their share of a full forward, per kind, so they can be reported inside the total or alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from mdmkit.core.config import require
from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import (
    CANVAS,
    CAUSAL_HEAD,
    HIDDEN_STATES,
    KV_CACHE,
    LOGITS_AT,
    AttentionPattern,
    Denoiser,
    capabilities_of,
    missing_capability,
)


class CountedNetwork(Protocol):
    """What a rule needs of the network: forwards charged to the batch rows they run on (`attn_mask` hiding left
    padding), and the NFE noted at each row's stop. The `ForwardCounter` is one; a walk that hands its rule part of
    each row (block diffusion's sub-blocks, SBD's blocks) passes a view of the counter that is another."""

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, /, *, logits_at: slice | None = None,
                 attn_mask: torch.Tensor | None = None) -> torch.Tensor: ...

    def mark_stopped(self, rows: torch.Tensor) -> None: ...


def _parameters(module: Any) -> int:
    return sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else 0


class ForwardCounter:
    """Wraps a network so each forward pass is charged to exactly the batch rows it ran on. It is all a sampler sees
    of the network (the `Denoiser` call and, each charged, the operations of the capabilities it declares), and the
    evaluation harness owns it, so a sampler cannot under-report."""

    def __init__(self, network: Denoiser, batch_size: int, on_forward: Callable[[], None] | None = None) -> None:
        self._network = network
        self._on_forward = on_forward  # a progress display's tick
        self.nfe = torch.zeros(batch_size, dtype=torch.long)
        self.tokens = torch.zeros(batch_size, dtype=torch.long)  # tokens computed (as queries) per row
        self.extra: dict[str, torch.Tensor] = {}  # kind -> per-row fractional cost
        self.nfe_at_stop = torch.full((batch_size,), -1, dtype=torch.long)  # generate_until point, -1: never

    @property
    def capabilities(self) -> frozenset[str]:
        return capabilities_of(self._network)

    def _count(self, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        if tokens.shape[0] != rows.numel():
            raise ValueError(f"{tokens.shape[0]} sequences passed for {rows.numel()} rows")
        rows = rows.cpu()
        self.nfe[rows] += 1
        self.tokens[rows] += tokens.shape[1]
        if self._on_forward is not None:
            self._on_forward()

    def _network_with(self, capability: str) -> Any:
        if capability not in self.capabilities:
            raise missing_capability(self._network, capability)
        return self._network

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, *, logits_at: slice | None = None,
                 **kwargs: Any) -> torch.Tensor:
        """Run the network on `tokens` [len(rows), L], the current state of batch rows `rows`; with `logits_at`,
        only those columns' logits come back (computed only there by a network with `logits_at`)."""
        self._count(tokens, rows)
        if logits_at is None:
            return self._network(tokens, **kwargs)
        if LOGITS_AT in self.capabilities:
            return self._network_with(LOGITS_AT)(tokens, logits_at=logits_at, **kwargs)
        return self._network(tokens, **kwargs)[:, logits_at]

    def forward_with_hidden(self, tokens: torch.Tensor, rows: torch.Tensor,
                            **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """`hidden_states`: one forward's logits and last hidden state."""
        network = self._network_with(HIDDEN_STATES)
        self._count(tokens, rows)
        return network.forward_with_hidden(tokens, **kwargs)

    @property
    def embed(self) -> torch.nn.Embedding:
        """`hidden_states`: the network's input embedding."""
        return self._network_with(HIDDEN_STATES).embed

    @property
    def n_layers(self) -> int:
        """`kv_cache`: how many layers a cache for this network holds."""
        return self._network_with(KV_CACHE).n_layers

    @property
    def shifted_logits(self) -> bool:
        """Whether the logits at position i come from the output at i - 1 (Dream), which a cached query window
        must then start one position early to compute (as the network declares it; undeclared: no)."""
        return isinstance(self._network, AttentionPattern) and self._network.shifted_logits

    @property
    def block_causal(self) -> bool:
        """Whether the network attends block-causally (Fast-dLLM v2's `attention_block`): a finished block never
        changes, so block diffusion caches it exactly; the masked loop's approximate caches do not apply."""
        return isinstance(self._network, AttentionPattern) and self._network.attention == "block_causal"

    def noncausal(self, tokens: torch.Tensor, rows: torch.Tensor, **kwargs: Any) -> Any:
        """`causal_head`: the trunk pass (a full forward) of a self-speculative network."""
        network = self._network_with(CAUSAL_HEAD)
        self._count(tokens, rows)
        return network.noncausal(tokens, **kwargs)

    def causal(self, rows: torch.Tensor, trunk: Any, tokens: torch.Tensor, order: torch.Tensor,
               n_known: torch.Tensor, *, charged: bool) -> torch.Tensor:
        """`causal_head`: a verification pass, charged at `causal_share` unless it is part of a trunk pass."""
        network = self._network_with(CAUSAL_HEAD)
        if charged:
            self.charge(rows, network.causal_share, "causal")
        return network.causal(trunk, tokens, order, n_known)

    @property
    def canvas(self) -> CanvasSpec:
        """`canvas`: the sizes and end / pad ids of a revisable-canvas network."""
        return self._network_with(CANVAS).canvas

    def open_canvas(self, prompt: torch.Tensor, keep: torch.Tensor | None) -> Any:
        """`canvas`: a batch's generation state over its left-padded prompts (nothing runs yet)."""
        return self._network_with(CANVAS).open(prompt, keep)

    def encode(self, rows: torch.Tensor, state: Any, tokens: torch.Tensor) -> None:
        """`canvas`: one encoder pass over `tokens` (the prompt, then a finished canvas) of every row of the batch,
        charged beside NFE as `encoder` (one each) to `rows`, the rows that still need its cache."""
        network = self._network_with(CANVAS)
        self.charge(rows, 1.0, "encoder")
        network.encode(state, tokens)

    def decode(self, rows: torch.Tensor, state: Any, canvas: torch.Tensor, self_conditioning: torch.Tensor | None,
               view: torch.Tensor | None = None) -> torch.Tensor:
        """`canvas`: one decoder forward over the canvases [R, L] of the batch rows `view` (None: every row),
        counted as a forward of `rows` only: the rows still denoising. A row of `view` not in `rows` runs for
        another reason than its own text (a row that ended its text, kept to reproduce a reference's batch)."""
        network = self._network_with(CANVAS)
        rows = rows.cpu()
        self.nfe[rows] += 1
        self.tokens[rows] += canvas.shape[1]
        if self._on_forward is not None:
            self._on_forward()
        return network.decode(state, canvas, self_conditioning, view)

    def share_of(self, other: Any) -> float:
        """Cost of a pass of `other` (a planner, an indicator) in forwards of this network: the ratio of
        parameter counts, or 1 where either count is unknown."""
        own, theirs = _parameters(self._network), _parameters(other)
        return theirs / own if own and theirs else 1.0

    def charge(self, rows: torch.Tensor, share: float, kind: str) -> None:
        """Record a pass of something other than the main network at `share` of a full forward."""
        if share < 0:
            raise ValueError(f"a pass cannot cost {share} forwards")
        cost = self.extra.setdefault(kind, torch.zeros(self.nfe.shape[0], dtype=torch.float64))
        cost[rows.cpu()] += share

    def mark_stopped(self, rows: torch.Tensor) -> None:
        """Note the NFE at which `rows` met their stop condition (the first time only)."""
        rows = rows.cpu()
        first = self.nfe_at_stop[rows] < 0
        self.nfe_at_stop[rows[first]] = self.nfe[rows[first]]

    @property
    def nfe_to_stop(self) -> torch.Tensor:
        """Per-row NFE at the stop condition, or the whole NFE of a row that never met it."""
        return torch.where(self.nfe_at_stop >= 0, self.nfe_at_stop, self.nfe)

    @property
    def cost(self) -> torch.Tensor:
        """Per-row total cost in full-forward units: NFE plus every fractional pass."""
        return sum(self.extra.values(), start=self.nfe.to(torch.float64))


def whole_counter(network: CountedNetwork, need: str) -> ForwardCounter:
    """`network` as the forward counter itself, which `need` (a KV cache, hidden states) asks of the network; a
    walk's view of it offers only plain forwards."""
    require(isinstance(network, ForwardCounter), f"{need} needs the network itself, not a walk's view of it")
    assert isinstance(network, ForwardCounter)  # for the type checker: `require` raised otherwise
    return network

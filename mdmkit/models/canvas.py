"""Revisable canvases: what a network that generates canvas by canvas offers its sampler (capability `canvas`).

Such a network (DiffusionGemma) reads the prompt and every finished canvas once, through a causal encoder whose KV
cache it keeps, and denoises the next canvas with a bidirectional decoder over that cache, fed the previous step's
logits (self-conditioning). It has no mask token: a canvas starts as uniformly random tokens and any step may
rewrite any position, so it is not a `Denoiser` and the masked samplers do not run on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class CanvasSpec:
    """What the canvas loop needs to know of the network: sizes and the ids that end and pad a text."""

    length: int  # tokens per canvas
    vocab_size: int  # the canvas's noise and the decoder's draws range over [0, vocab_size)
    eos_ids: tuple[int, ...]  # a canvas holding one ends its row (none: rows run to full length)
    pad_id: int | None  # what follows a row's end (None: left as decoded)
    # the whole sequence is one canvas (mdmkit's own networks): no encoder; the positions to fill may lie anywhere
    in_place: bool = False


class CanvasDenoiser(Protocol):
    """Capability `canvas`. `open` starts a batch of left-padded prompts (`keep` [B, T]: True = a real token; None:
    no padding) and returns its state (the encoder cache, masks, positions); `encode` runs the encoder over `tokens`
    [B, T] (the prompt, then each finished canvas) into that state; `decode` is one decoder forward over `canvas`
    [R, L] with the previous step's logits (None at a canvas's first step), returning float32 logits [R, L, V]:
    for the batch rows `rows` (ascending; None: every row), the others left out of the forward. An `in_place` network
    is opened on the whole rows with `keep` False at the positions to fill, keeps its givens and never encodes."""

    @property
    def canvas(self) -> CanvasSpec: ...

    def open(self, prompt: torch.Tensor, keep: torch.Tensor | None) -> Any: ...

    def encode(self, state: Any, tokens: torch.Tensor) -> None: ...

    def decode(self, state: Any, canvas: torch.Tensor, self_conditioning: torch.Tensor | None,
               rows: torch.Tensor | None = None) -> torch.Tensor: ...

"""Roofline estimate of one decoding forward of a transformer, as in Set Block Decoding (SBD, section 4).

Why: SBD cuts the number of forwards 3-5x but every forward carries a block of k tokens (2k on the first
forward of a block). Whether fewer forwards means less wall-clock time depends on whether a decoding forward
is memory bound (then k tokens cost about as much as one) or compute bound. The roofline model answers that
from a handful of constants, without a GPU.

Model (the paper's, eq. 15): every operation takes `max(flops / peak_flops, bytes / memory_bandwidth)`.
One layer = the fused attention kernel (reads Q, K and V, writes the output; QK^T and PV flops at the
attention peak) + one roofline term per weight matrix (reads activations and weights, writes activations;
2 * tokens * rows * cols flops). A forward = `num_layers` layers (+ the LM head when `vocab_size > 0`).

Shape conventions:
- "paper" follows the appendix code (Figure 11) literally, which is what produced Tables 3 and 4. It has two
  slips: the FFN matrices are `hidden x (hidden * ffn_dim)` with `ffn_dim = 4 * hidden` (4096 times too
  large; it implies ~17.6T parameters for the "8B" model), and the K/V projections are
  `hidden x (num_heads * num_kv_heads)` instead of `hidden x (num_kv_heads * head_dim)`. The oversized FFN
  makes the KV-cache reads negligible, so the paper's tables barely depend on the KV length.
- "corrected" fixes only those two slips (FFN `hidden x ffn_dim`, K/V `hidden x num_kv_heads * head_dim`) and
  adds the gated third FFN matrix where `gated_ffn` is set; everything else is computed the same way.
Ratios (slowdowns, speedups) do not depend on `num_layers` unless an LM head is counted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal

import numpy as np

from mdmkit.core.config import require

ShapeConvention = Literal["paper", "corrected"]
SHAPE_CONVENTIONS: tuple[str, ...] = ("paper", "corrected")


def _require_positive_int(value: Any, name: str, minimum: int = 1) -> None:
    require(isinstance(value, Integral) and not isinstance(value, bool) and value >= minimum,
            f"{name} must be an integer >= {minimum}, got {value!r}")


def _require_positive_real(value: Any, name: str) -> None:
    require(isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
            f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class Hardware:
    """The three numbers the roofline needs from an accelerator.

    `peak_flops` applies to the weight matmuls (e.g. FP8 tensor cores), `attention_peak_flops` to the fused
    attention kernel (the paper assumes it runs in BF16), `memory_bandwidth` is in bytes per second.
    """

    name: str
    peak_flops: float
    attention_peak_flops: float
    memory_bandwidth: float

    def __post_init__(self) -> None:
        _require_positive_real(self.peak_flops, "peak_flops")
        _require_positive_real(self.attention_peak_flops, "attention_peak_flops")
        _require_positive_real(self.memory_bandwidth, "memory_bandwidth")

    @property
    def ridge_point(self) -> float:
        """Flops per byte above which a matmul is compute bound (a 1-byte-weight matmul does ~2 * tokens)."""
        return self.peak_flops / self.memory_bandwidth


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer as deployed: dimensions and bytes per weight, activation and KV element."""

    name: str
    hidden_dim: int
    ffn_dim: int
    num_heads: int
    head_dim: int
    num_kv_heads: int
    num_layers: int = 1
    vocab_size: int = 0  # 0: leave the LM head out, as the paper does
    gated_ffn: bool = False  # SwiGLU-style FFN with a third (gate) matrix; the paper's FFN has two
    weight_bytes: float = 1.0
    activation_bytes: float = 1.0
    kv_bytes: float = 1.0
    convention: ShapeConvention = "corrected"

    def __post_init__(self) -> None:
        for name in ("hidden_dim", "ffn_dim", "num_heads", "head_dim", "num_kv_heads", "num_layers"):
            _require_positive_int(getattr(self, name), name)
        _require_positive_int(self.vocab_size, "vocab_size", minimum=0)
        for name in ("weight_bytes", "activation_bytes", "kv_bytes"):
            _require_positive_real(getattr(self, name), name)
        require(self.convention in SHAPE_CONVENTIONS,
                f"convention must be one of {', '.join(SHAPE_CONVENTIONS)}, got {self.convention!r}")
        require(self.convention == "corrected" or not self.gated_ffn,
                "the 'paper' shape convention has no gated FFN; use convention='corrected'")
        require(self.num_heads % self.num_kv_heads == 0,
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    def layer_weight_shapes(self) -> tuple[tuple[int, int], ...]:
        """(rows, cols) of every weight matrix in one layer; the roofline term is symmetric in the two."""
        attention_dim = self.num_heads * self.head_dim
        if self.convention == "paper":
            kv_projection = self.num_heads * self.num_kv_heads
            ffn_inner = self.hidden_dim * self.ffn_dim
            ffn = ((self.hidden_dim, ffn_inner), (ffn_inner, self.hidden_dim))
        else:
            kv_projection = self.num_kv_heads * self.head_dim
            ffn = ((self.hidden_dim, self.ffn_dim),) * (3 if self.gated_ffn else 2)
        attention = ((self.hidden_dim, attention_dim), (self.hidden_dim, kv_projection),
                     (self.hidden_dim, kv_projection), (attention_dim, self.hidden_dim))
        return ffn + attention

    @property
    def parameter_count(self) -> int:
        """Weights implied by the shapes: layer matrices + input embedding + LM head (norms ignored)."""
        per_layer = sum(rows * cols for rows, cols in self.layer_weight_shapes())
        return self.num_layers * per_layer + 2 * self.vocab_size * self.hidden_dim

    def with_convention(self, convention: ShapeConvention) -> ModelShape:
        return dataclasses.replace(self, convention=convention)


@dataclass(frozen=True)
class ForwardTime:
    """Roofline seconds of one forward, split where it goes; `total` is what the tables compare."""

    attention: float
    linear: float
    lm_head: float

    @property
    def total(self) -> float:
        return self.attention + self.linear + self.lm_head


def matmul_time(tokens: int, rows: int, cols: int, model: ModelShape, hardware: Hardware) -> float:
    """Roofline time of `[tokens, rows] @ [rows, cols]` with a weight as right operand.

    Bytes: read the activations and the weight, write the result. Flops: 2 * tokens * rows * cols.
    """
    bytes_moved = (tokens * rows + tokens * cols) * model.activation_bytes + rows * cols * model.weight_bytes
    flops = 2.0 * tokens * rows * cols
    return max(bytes_moved / hardware.memory_bandwidth, flops / hardware.peak_flops)


def attention_time(model: ModelShape, hardware: Hardware, block_size: int, kv_length: int,
                   batch_size: int) -> float:
    """Roofline time of one layer's fused (flash) attention: the score matrix never touches memory.

    `kv_length` keys are read per sequence (grouped-query: `num_kv_heads` heads); every query head does
    QK^T and PV over all of them.
    """
    tokens = block_size * batch_size
    query_and_output_bytes = 2 * tokens * model.num_heads * model.head_dim * model.activation_bytes
    key_and_value_bytes = 2 * batch_size * kv_length * model.num_kv_heads * model.head_dim * model.kv_bytes
    flops = 2 * (2.0 * tokens * kv_length * model.num_heads * model.head_dim)
    return max((query_and_output_bytes + key_and_value_bytes) / hardware.memory_bandwidth,
               flops / hardware.attention_peak_flops)


def _check_forward_args(block_size: int, kv_length: int, batch_size: int) -> None:
    _require_positive_int(block_size, "block_size")
    _require_positive_int(kv_length, "kv_length", minimum=0)
    _require_positive_int(batch_size, "batch_size")


def forward_breakdown(model: ModelShape, hardware: Hardware, block_size: int, kv_length: int,
                      batch_size: int) -> ForwardTime:
    """Roofline seconds of one forward that processes `block_size` new tokens per sequence."""
    _check_forward_args(block_size, kv_length, batch_size)
    tokens = block_size * batch_size
    linear = sum(matmul_time(tokens, rows, cols, model, hardware)
                 for rows, cols in model.layer_weight_shapes())
    attention = attention_time(model, hardware, block_size, kv_length, batch_size)
    lm_head = 0.0
    if model.vocab_size:
        lm_head = matmul_time(tokens, model.hidden_dim, model.vocab_size, model, hardware)
    return ForwardTime(attention=model.num_layers * attention, linear=model.num_layers * linear,
                       lm_head=lm_head)


def forward_time(model: ModelShape, hardware: Hardware, block_size: int, kv_length: int,
                 batch_size: int) -> float:
    """Roofline seconds of one forward (`forward_breakdown(...).total`)."""
    return forward_breakdown(model, hardware, block_size, kv_length, batch_size).total


def block_slowdown(model: ModelShape, hardware: Hardware, block_size: int, kv_length: int,
                   batch_size: int) -> float:
    """time(block_size) / time(1): Table 3's cost of one block forward relative to one NTP forward."""
    return (forward_time(model, hardware, block_size, kv_length, batch_size)
            / forward_time(model, hardware, 1, kv_length, batch_size))


def sbd_speedup(model: ModelShape, hardware: Hardware, block_size: int, nfe_speedup: float, kv_length: int,
                batch_size: int) -> float:
    """Wall-clock speedup of SBD over NTP for one block of k tokens (paper eq. 16, Table 4).

    NTP: k forwards of one token. SBD: l = k / nfe_speedup forwards; the first carries 2k tokens (the
    previous block, to fill its KV cache, plus k masks), the other l - 1 carry k. So
    speedup = k * time(1) / (time(2k) + (l - 1) * time(k)). l need not be an integer (it is a mean).
    """
    _check_forward_args(block_size, kv_length, batch_size)
    _require_positive_real(nfe_speedup, "nfe_speedup")
    require(1 <= nfe_speedup <= block_size,
            f"nfe_speedup must be in [1, block_size={block_size}] (at least one forward per block), "
            f"got {nfe_speedup!r}")
    forwards = block_size / nfe_speedup
    ntp = block_size * forward_time(model, hardware, 1, kv_length, batch_size)
    sbd = (forward_time(model, hardware, 2 * block_size, kv_length, batch_size)
           + (forwards - 1) * forward_time(model, hardware, block_size, kv_length, batch_size))
    return ntp / sbd


@dataclass(frozen=True)
class RooflineTable:
    """Tables 3 and 4 for one model/GPU. Arrays are indexed [kv_length, block_size], keyed by batch size
    (and NFE speedup); speedups are NaN where nfe_speedup > block_size (fewer than one forward per block)."""

    model: ModelShape
    hardware: Hardware
    block_sizes: tuple[int, ...]
    kv_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    nfe_speedups: tuple[float, ...]
    forward_seconds: dict[int, np.ndarray]
    attention_seconds: dict[int, np.ndarray]
    slowdown: dict[int, np.ndarray]
    speedup: dict[tuple[int, float], np.ndarray]

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per (batch size, KV length, block size)."""
        rows = []
        for batch in self.batch_sizes:
            for i, kv_length in enumerate(self.kv_lengths):
                for j, block in enumerate(self.block_sizes):
                    speedups = {f"{nfe:g}": _finite_or_none(self.speedup[batch, nfe][i, j])
                                for nfe in self.nfe_speedups}
                    rows.append({"batch_size": batch, "kv_length": kv_length, "block_size": block,
                                 "forward_seconds": float(self.forward_seconds[batch][i, j]),
                                 "attention_seconds": float(self.attention_seconds[batch][i, j]),
                                 "slowdown": float(self.slowdown[batch][i, j]),
                                 "speedup_by_nfe_speedup": speedups})
        return rows


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def roofline_table(model: ModelShape, hardware: Hardware, block_sizes: tuple[int, ...] | list[int],
                   kv_lengths: tuple[int, ...] | list[int], batch_sizes: tuple[int, ...] | list[int],
                   nfe_speedups: tuple[float, ...] | list[float] = ()) -> RooflineTable:
    """Forward times, slowdowns (Table 3) and SBD wall-clock speedups (Table 4) over a grid."""
    axes = (("block_sizes", block_sizes), ("kv_lengths", kv_lengths), ("batch_sizes", batch_sizes))
    for name, values in axes:
        require(len(values) > 0, f"{name} must not be empty")
    for nfe in nfe_speedups:
        _require_positive_real(nfe, "nfe_speedup")
        require(nfe >= 1, f"nfe_speedup must be >= 1, got {nfe!r}")
    shape = (len(kv_lengths), len(block_sizes))
    forward_seconds, attention_seconds, slowdown, speedup = {}, {}, {}, {}
    for batch in batch_sizes:
        forward_seconds[batch] = np.empty(shape)
        attention_seconds[batch] = np.empty(shape)
        slowdown[batch] = np.empty(shape)
        for nfe in nfe_speedups:
            speedup[batch, nfe] = np.full(shape, np.nan)
        for i, kv_length in enumerate(kv_lengths):
            for j, block in enumerate(block_sizes):
                breakdown = forward_breakdown(model, hardware, block, kv_length, batch)
                forward_seconds[batch][i, j] = breakdown.total
                attention_seconds[batch][i, j] = breakdown.attention
                slowdown[batch][i, j] = block_slowdown(model, hardware, block, kv_length, batch)
                for nfe in nfe_speedups:
                    if nfe <= block:
                        speedup[batch, nfe][i, j] = sbd_speedup(model, hardware, block, nfe, kv_length, batch)
    return RooflineTable(model=model, hardware=hardware, block_sizes=tuple(block_sizes),
                         kv_lengths=tuple(kv_lengths), batch_sizes=tuple(batch_sizes),
                         nfe_speedups=tuple(nfe_speedups), forward_seconds=forward_seconds,
                         attention_seconds=attention_seconds, slowdown=slowdown, speedup=speedup)


# The paper's constants (section 4.1, Figure 6). MEMORY_BANDWIDTH there is 3.35 * 1024**4 B/s (3.35 TiB/s),
# although the H100 SXM data sheet says 3.35 TB/s; it is kept as printed because the tables use it.
PAPER_H100 = Hardware(name="H100 (SBD paper constants)", peak_flops=1978e12, attention_peak_flops=989e12,
                      memory_bandwidth=3.35 * 1024**4)
# "Standard 8B transformer": hidden 4096, FFN 4 * 4096, 32 heads of 128, 8 KV heads, FP8 weights and KV.
# The paper does not state the layer count; 32 (Llama-3-8B's) only matters for absolute times.
PAPER_8B = ModelShape(name="standard 8B (SBD paper constants)", hidden_dim=4096, ffn_dim=4 * 4096,
                      num_heads=32, head_dim=128, num_kv_heads=8, num_layers=32, vocab_size=0,
                      gated_ffn=False, weight_bytes=1, activation_bytes=1, kv_bytes=1, convention="paper")
PAPER_BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
PAPER_SPEEDUP_BLOCK_SIZES: tuple[int, ...] = (8, 16, 32, 64)
PAPER_KV_LENGTHS: tuple[int, ...] = tuple(2**p for p in (4, 8, 10, 12, 14, 16, 20, 22))
PAPER_BATCH_SIZES: tuple[int, ...] = (1, 4, 8, 16)
PAPER_SPEEDUP_BATCH_SIZES: tuple[int, ...] = (1, 4, 8)
PAPER_NFE_SPEEDUPS: tuple[float, ...] = (2, 4, 8)

"""The SBD paper's Tables 3 and 4 as data, our roofline next to them, and model/GPU presets.

Why: a cost model is only trusted once it reproduces the numbers it claims to explain. The paper's tables are
transcribed here cell by cell so that `compare_with_paper` can say, for every printed value, how far our
`benchmarks.roofline` is from it; the presets name the real models and GPUs the same analysis is run for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from benchmarks.roofline import (
    PAPER_8B,
    PAPER_BATCH_SIZES,
    PAPER_BLOCK_SIZES,
    PAPER_H100,
    PAPER_KV_LENGTHS,
    PAPER_NFE_SPEEDUPS,
    PAPER_SPEEDUP_BLOCK_SIZES,
    Hardware,
    ModelShape,
    RooflineTable,
    roofline_table,
)

PAPER = ("Set Block Decoding is a Language Model Inference Accelerator (Gat et al., 2025), section 4 and "
         "Tables 3-4")
# The paper prints three decimals: a correct reproduction is within half a unit of the last digit.
ROUNDING_TOLERANCE = 0.0005

# Transcribed from the paper. Rows: KV lengths PAPER_KV_LENGTHS; columns: PAPER_BLOCK_SIZES (Table 3) or
# PAPER_SPEEDUP_BLOCK_SIZES (Table 4, keyed by (batch size, NFE speedup)).
PAPER_TABLE3: dict[int, tuple[tuple[float, ...], ...]] = {
    1: (
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015),  # KV 16
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015),  # KV 256
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015),  # KV 1,024
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015),  # KV 4,096
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015),  # KV 16,384
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.016),  # KV 65,536
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.019),  # KV 1,048,576
        (1.000, 1.000, 1.001, 1.002, 1.004, 1.007, 1.029),  # KV 4,194,304
    ),
    4: (
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.061),  # KV 16
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.061),  # KV 256
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.061),  # KV 1,024
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.062),  # KV 4,096
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.062),  # KV 16,384
        (1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.062),  # KV 65,536
        (1.000, 1.001, 1.003, 1.007, 1.014, 1.030, 1.074),  # KV 1,048,576
        (1.000, 1.001, 1.003, 1.006, 1.014, 1.028, 1.111),  # KV 4,194,304
    ),
    8: (
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 16
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 256
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 1,024
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 4,096
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 16,384
        (1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903),  # KV 65,536
        (1.000, 1.002, 1.006, 1.013, 1.028, 1.059, 1.903),  # KV 1,048,576
        (1.000, 1.002, 1.005, 1.012, 1.026, 1.054, 1.904),  # KV 4,194,304
    ),
    16: (
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.799),  # KV 16
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.799),  # KV 256
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.799),  # KV 1,024
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.798),  # KV 4,096
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.797),  # KV 16,384
        (1.000, 1.004, 1.012, 1.027, 1.058, 1.896, 3.792),  # KV 65,536
        (1.000, 1.004, 1.011, 1.026, 1.055, 1.847, 3.688),  # KV 1,048,576
        (1.000, 1.003, 1.009, 1.022, 1.047, 1.720, 3.422),  # KV 4,194,304
    ),
}
PAPER_TABLE4: dict[tuple[int, int], tuple[tuple[float, ...], ...]] = {
    (1, 2): (
        (1.996, 1.992, 1.984, 1.969),  # KV 16
        (1.996, 1.992, 1.984, 1.969),  # KV 256
        (1.996, 1.992, 1.984, 1.969),  # KV 1,024
        (1.996, 1.992, 1.984, 1.969),  # KV 4,096
        (1.996, 1.992, 1.984, 1.969),  # KV 16,384
        (1.996, 1.992, 1.984, 1.968),  # KV 65,536
        (1.996, 1.992, 1.984, 1.962),  # KV 1,048,576
        (1.996, 1.992, 1.983, 1.941),  # KV 4,194,304
    ),
    (1, 4): (
        (3.989, 3.982, 3.966, 3.936),  # KV 16
        (3.989, 3.982, 3.966, 3.936),  # KV 256
        (3.989, 3.982, 3.966, 3.936),  # KV 1,024
        (3.989, 3.982, 3.966, 3.936),  # KV 4,096
        (3.989, 3.982, 3.966, 3.935),  # KV 16,384
        (3.989, 3.982, 3.966, 3.935),  # KV 65,536
        (3.989, 3.982, 3.965, 3.920),  # KV 1,048,576
        (3.989, 3.982, 3.960, 3.876),  # KV 4,194,304
    ),
    (1, 8): (
        (7.971, 7.955, 7.925, 7.864),  # KV 16
        (7.971, 7.955, 7.925, 7.864),  # KV 256
        (7.971, 7.955, 7.925, 7.864),  # KV 1,024
        (7.971, 7.955, 7.925, 7.864),  # KV 4,096
        (7.971, 7.955, 7.924, 7.863),  # KV 16,384
        (7.971, 7.955, 7.924, 7.862),  # KV 65,536
        (7.971, 7.956, 7.918, 7.830),  # KV 1,048,576
        (7.971, 7.956, 7.898, 7.732),  # KV 4,194,304
    ),
    (4, 2): (
        (1.983, 1.967, 1.938, 1.839),  # KV 16
        (1.983, 1.967, 1.938, 1.839),  # KV 256
        (1.983, 1.967, 1.938, 1.838),  # KV 1,024
        (1.983, 1.967, 1.938, 1.838),  # KV 4,096
        (1.983, 1.967, 1.938, 1.838),  # KV 16,384
        (1.983, 1.967, 1.938, 1.837),  # KV 65,536
        (1.983, 1.968, 1.937, 1.816),  # KV 1,048,576
        (1.984, 1.969, 1.935, 1.755),  # KV 4,194,304
    ),
    (4, 4): (
        (3.958, 3.927, 3.868, 3.590),  # KV 16
        (3.958, 3.927, 3.868, 3.590),  # KV 256
        (3.958, 3.927, 3.868, 3.590),  # KV 1,024
        (3.958, 3.927, 3.868, 3.590),  # KV 4,096
        (3.958, 3.927, 3.868, 3.589),  # KV 16,384
        (3.958, 3.927, 3.868, 3.587),  # KV 65,536
        (3.958, 3.928, 3.863, 3.545),  # KV 1,048,576
        (3.960, 3.931, 3.851, 3.425),  # KV 4,194,304
    ),
    (4, 8): (
        (7.885, 7.824, 7.707, 6.856),  # KV 16
        (7.885, 7.824, 7.707, 6.856),  # KV 256
        (7.885, 7.824, 7.707, 6.856),  # KV 1,024
        (7.885, 7.824, 7.707, 6.855),  # KV 4,096
        (7.885, 7.824, 7.706, 6.854),  # KV 16,384
        (7.885, 7.825, 7.705, 6.850),  # KV 65,536
        (7.886, 7.827, 7.685, 6.768),  # KV 1,048,576
        (7.891, 7.834, 7.625, 6.534),  # KV 4,194,304
    ),
    (8, 2): (
        (1.966, 1.936, 1.797, 1.019),  # KV 16
        (1.966, 1.936, 1.797, 1.019),  # KV 256
        (1.966, 1.936, 1.797, 1.019),  # KV 1,024
        (1.966, 1.936, 1.797, 1.019),  # KV 4,096
        (1.966, 1.936, 1.797, 1.019),  # KV 16,384
        (1.966, 1.936, 1.797, 1.019),  # KV 65,536
        (1.967, 1.938, 1.800, 1.019),  # KV 1,048,576
        (1.969, 1.943, 1.807, 1.019),  # KV 4,194,304
    ),
    (8, 4): (
        (3.916, 3.857, 3.431, 1.978),  # KV 16
        (3.916, 3.857, 3.431, 1.978),  # KV 256
        (3.916, 3.857, 3.431, 1.978),  # KV 1,024
        (3.916, 3.857, 3.431, 1.978),  # KV 4,096
        (3.916, 3.857, 3.431, 1.978),  # KV 16,384
        (3.916, 3.857, 3.431, 1.978),  # KV 65,536
        (3.918, 3.861, 3.436, 1.978),  # KV 1,048,576
        (3.925, 3.872, 3.448, 1.978),  # KV 4,194,304
    ),
    (8, 8): (
        (7.773, 7.657, 6.294, 3.736),  # KV 16
        (7.773, 7.657, 6.294, 3.736),  # KV 256
        (7.773, 7.657, 6.294, 3.736),  # KV 1,024
        (7.773, 7.657, 6.294, 3.736),  # KV 4,096
        (7.773, 7.657, 6.294, 3.736),  # KV 16,384
        (7.773, 7.657, 6.294, 3.736),  # KV 65,536
        (7.779, 7.667, 6.300, 3.736),  # KV 1,048,576
        (7.797, 7.693, 6.318, 3.736),  # KV 4,194,304
    ),
}

# Presets keep the paper's FP8 weights and KV cache (override with --weight-bytes / --kv-bytes); layer counts,
# FFN sizes and vocabularies from the models' published configs (Llama-3.1-8B, Qwen3-8B: SwiGLU, GQA 32/8).
MODEL_PRESETS: dict[str, ModelShape] = {
    "paper-8b": PAPER_8B,
    "llama3.1-8b": ModelShape(name="Llama-3.1-8B", hidden_dim=4096, ffn_dim=14336, num_heads=32, head_dim=128,
                              num_kv_heads=8, num_layers=32, vocab_size=128256, gated_ffn=True),
    "qwen3-8b": ModelShape(name="Qwen3-8B", hidden_dim=4096, ffn_dim=12288, num_heads=32, head_dim=128,
                           num_kv_heads=8, num_layers=36, vocab_size=151936, gated_ffn=True),
}
# Dense (no sparsity) tensor-core peaks from the data sheets; attention at the BF16 peak as in the paper.
GPU_PRESETS: dict[str, Hardware] = {
    "paper-h100": PAPER_H100,
    "h100-sxm": Hardware(name="H100 SXM (data sheet)", peak_flops=1979e12, attention_peak_flops=989e12,
                         memory_bandwidth=3.35e12),
    "h200": Hardware(name="H200 SXM (data sheet)", peak_flops=1979e12, attention_peak_flops=989e12,
                     memory_bandwidth=4.8e12),
}


def paper_cells() -> Iterator[tuple[int, int, int | None, int, int, float]]:
    """Every transcribed cell: (table number, batch size, NFE speedup or None for Table 3, KV length, block
    size, printed value)."""
    printed = [(3, batch, None, rows, PAPER_BLOCK_SIZES) for batch, rows in PAPER_TABLE3.items()]
    printed += [(4, batch, nfe, rows, PAPER_SPEEDUP_BLOCK_SIZES)
                for (batch, nfe), rows in PAPER_TABLE4.items()]
    for number, batch, nfe, rows, blocks in printed:
        for kv_length, paper_row in zip(PAPER_KV_LENGTHS, rows, strict=True):
            for block, value in zip(blocks, paper_row, strict=True):
                yield number, batch, nfe, kv_length, block, value


def paper_value(batch: int, nfe: float | None, kv_length: int, block: int) -> float | None:
    """The paper's printed value of a cell of Table 3 (`nfe` None) or Table 4; None where it printed none."""
    if kv_length not in PAPER_KV_LENGTHS:
        return None
    row = PAPER_KV_LENGTHS.index(kv_length)
    if nfe is None:
        rows = PAPER_TABLE3.get(batch)
        columns = PAPER_BLOCK_SIZES
    else:
        rows = PAPER_TABLE4.get((batch, int(nfe))) if float(nfe).is_integer() else None
        columns = PAPER_SPEEDUP_BLOCK_SIZES
    if rows is None or block not in columns:
        return None
    return rows[row][columns.index(block)]


def paper_grid_table(model: ModelShape = PAPER_8B) -> RooflineTable:
    """`model` on the paper's H100 over the paper's grid (what `compare_with_paper` needs)."""
    return roofline_table(model, PAPER_H100, PAPER_BLOCK_SIZES, PAPER_KV_LENGTHS, PAPER_BATCH_SIZES,
                          PAPER_NFE_SPEEDUPS)


def compare_with_paper(table: RooflineTable) -> dict[str, Any]:
    """Every transcribed cell next to ours, with the deviations; `table` must cover the paper's grid."""
    cells = []
    for number, batch, nfe, kv_length, block, paper in paper_cells():
        values = table.slowdown[batch] if nfe is None else table.speedup[batch, nfe]
        ours = float(values[table.kv_lengths.index(kv_length), table.block_sizes.index(block)])
        deviation = abs(ours - paper)
        cells.append({"table": number, "batch_size": batch, "nfe_speedup": nfe, "kv_length": kv_length,
                      "block_size": block, "paper": paper, "ours": ours, "abs_deviation": deviation,
                      "rel_deviation": deviation / paper, "rounds_to_paper": round(ours, 3) == paper})
    summary = {}
    for number in (3, 4):
        subset = [cell for cell in cells if cell["table"] == number]
        summary[f"table{number}"] = {
            "cells": len(subset),
            "max_abs_deviation": max(cell["abs_deviation"] for cell in subset),
            "max_rel_deviation": max(cell["rel_deviation"] for cell in subset),
            "cells_rounding_to_paper": sum(cell["rounds_to_paper"] for cell in subset),
            "cells_within_tolerance": sum(cell["abs_deviation"] <= ROUNDING_TOLERANCE for cell in subset),
        }
    return {"tolerance_abs": ROUNDING_TOLERANCE, "summary": summary, "cells": cells}


def paper_values_json() -> dict[str, Any]:
    """The transcribed tables as JSON, keyed as the paper lays them out."""
    return {
        "kv_lengths": PAPER_KV_LENGTHS,
        "table3": {"block_sizes": PAPER_BLOCK_SIZES,
                   "by_batch_size": {str(batch): rows for batch, rows in PAPER_TABLE3.items()}},
        "table4": {"block_sizes": PAPER_SPEEDUP_BLOCK_SIZES,
                   "by_batch_size_and_nfe_speedup": {f"{batch},{nfe}": rows
                                                     for (batch, nfe), rows in PAPER_TABLE4.items()}},
    }

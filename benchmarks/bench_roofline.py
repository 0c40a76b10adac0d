"""Roofline estimate of Set Block Decoding (SBD) speedups: the paper's Tables 3 and 4, or your model and GPU.

    python -m benchmarks.bench_roofline                                   # the paper's H100 / 8B tables vs ours
    python -m benchmarks.bench_roofline --model llama3.1-8b --gpu h200 --weight-bytes 2 --kv-bytes 2 \
        --out docs/results/sbd_roofline_llama_h200
    python -m benchmarks.bench_roofline --name "13B, MHA" --hidden-dim 5120 --ffn-dim 13824 --gated-ffn \
        --num-heads 40 --num-kv-heads 40 --num-layers 40 --vocab-size 32000 --weight-bytes 2 --kv-bytes 2 \
        --peak-flops 312e12 --attention-peak-flops 312e12 --memory-bandwidth 2.0e12 --out outputs/a100_13b

Writes <out>.md (tables; with the paper's setup, each cell as "ours (paper)" plus the deviation), <out>.json
(every value) and <out>.png (slowdown time(k)/time(1) against KV length, one line per block size k).
Table 3 = time(k) / time(1); Table 4 = k time(1) / (time(2k) + (l - 1) time(k)), l = k / NFE speedup
(see `benchmarks.roofline` for the cost model and the paper's two shape slips, `roofline_tables` for the
paper's values and the presets, `roofline_page` for the page).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from benchmarks.roofline import (
    PAPER_BATCH_SIZES,
    PAPER_BLOCK_SIZES,
    PAPER_KV_LENGTHS,
    PAPER_NFE_SPEEDUPS,
    SHAPE_CONVENTIONS,
    Hardware,
    ModelShape,
)
from benchmarks.roofline_page import RooflineGrid, write_roofline_page
from benchmarks.roofline_tables import GPU_PRESETS, MODEL_PRESETS
from mdmkit.analysis.pages import Page, command_line
from mdmkit.core.errors import MdmkitError

MODEL_FLAGS = ("hidden_dim", "ffn_dim", "num_heads", "head_dim", "num_kv_heads", "num_layers", "vocab_size",
               "gated_ffn")
PRECISION_FLAGS = ("weight_bytes", "activation_bytes", "kv_bytes")
GPU_FLAGS = ("peak_flops", "attention_peak_flops", "memory_bandwidth")


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/sbd_roofline",
                        help="output prefix: writes <out>.md, <out>.json, <out>.png (default %(default)s)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--model", choices=sorted(MODEL_PRESETS), default="paper-8b",
                        help="model preset that the flags below override (default %(default)s)")
    parser.add_argument("--gpu", choices=sorted(GPU_PRESETS), default="paper-h100",
                        help="GPU preset that the flags below override (default %(default)s)")
    model = parser.add_argument_group("model (override the preset)")
    model.add_argument("--name", help="label for the model in the outputs")
    model.add_argument("--hidden-dim", type=int)
    model.add_argument("--ffn-dim", type=int, help="FFN inner size (e.g. 14336 for Llama-3.1-8B)")
    model.add_argument("--num-heads", type=int, help="query heads")
    model.add_argument("--head-dim", type=int)
    model.add_argument("--num-kv-heads", type=int, help="key/value heads (grouped-query attention)")
    model.add_argument("--num-layers", type=int)
    model.add_argument("--vocab-size", type=int, help="LM head rows; 0 leaves the LM head out (as the paper)")
    model.add_argument("--gated-ffn", action=argparse.BooleanOptionalAction, default=None,
                       help="SwiGLU FFN with three matrices instead of two")
    model.add_argument("--weight-bytes", type=float, help="bytes per weight (1 = FP8, 2 = BF16)")
    model.add_argument("--activation-bytes", type=float,
                       help="bytes per activation a matmul reads/writes (default: --weight-bytes if given)")
    model.add_argument("--kv-bytes", type=float, help="bytes per KV-cache element")
    model.add_argument("--shapes", choices=SHAPE_CONVENTIONS,
                       help="'paper': the appendix code's literal matrix shapes (reproduces Tables 3-4, with "
                            "its two slips); 'corrected': the slips fixed. Default: the preset's "
                            "('paper' for paper-8b), but 'corrected' once a dimension flag is given")
    gpu = parser.add_argument_group("GPU (override the preset)")
    gpu.add_argument("--peak-flops", type=float, help="FLOP/s of the weight matmuls, e.g. 1978e12")
    gpu.add_argument("--attention-peak-flops", type=float, help="FLOP/s inside fused attention, e.g. 989e12")
    gpu.add_argument("--memory-bandwidth", type=float, help="bytes/s, e.g. 3.35e12")
    grid = parser.add_argument_group("grid")
    grid.add_argument("--block-sizes", type=int_list, default=PAPER_BLOCK_SIZES, help="e.g. 1,2,4,8,16,32,64")
    grid.add_argument("--kv-lengths", type=int_list, default=PAPER_KV_LENGTHS, help="KV-cache lengths")
    grid.add_argument("--batch-sizes", type=int_list, default=PAPER_BATCH_SIZES, help="e.g. 1,4,8,16")
    grid.add_argument("--nfe-speedups", type=float_list, default=PAPER_NFE_SPEEDUPS,
                      help="k / l, forwards saved per block, for the wall-clock speedup tables (e.g. 2,4,8)")
    return parser.parse_args(argv)


def build_setup(args: argparse.Namespace) -> tuple[ModelShape, Hardware]:
    """The preset with every given flag applied; raises ConfigError for values that cannot work."""
    preset = MODEL_PRESETS[args.model]
    overrides = {name: getattr(args, name) for name in MODEL_FLAGS + PRECISION_FLAGS
                 if getattr(args, name) is not None}
    if args.weight_bytes is not None and args.activation_bytes is None:
        overrides["activation_bytes"] = args.weight_bytes  # the paper uses one BYTES for both
    shapes = args.shapes
    if shapes is None:
        shapes = "corrected" if any(name in overrides for name in MODEL_FLAGS) else preset.convention
    model = dataclasses.replace(preset, convention=shapes, **overrides)
    if args.name:
        model = dataclasses.replace(model, name=args.name)
    elif model != preset:
        model = dataclasses.replace(model, name=f"{preset.name}, modified ({shapes} shapes)")
    hardware_preset = GPU_PRESETS[args.gpu]
    hardware = dataclasses.replace(hardware_preset, **{name: getattr(args, name) for name in GPU_FLAGS
                                                       if getattr(args, name) is not None})
    if hardware != hardware_preset:
        hardware = dataclasses.replace(hardware, name=f"{hardware_preset.name}, modified")
    return model, hardware


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    grid = RooflineGrid(args.block_sizes, args.kv_lengths, args.batch_sizes, args.nfe_speedups)
    try:
        model, hardware = build_setup(args)
        page, command = Page(Path(args.out)), command_line(__file__, argv)
        result = write_roofline_page(model, hardware, grid, page, command, plot=not args.no_plot)
    except (MdmkitError, OSError) as error:
        print(f"roofline.py: error: {error}", file=sys.stderr)
        return 2
    comparison = result["paper_comparison"]
    if comparison:
        for name, stats in comparison["summary"].items():
            print(f"{name}: max |ours - paper| {stats['max_abs_deviation']:.6f}, max relative "
                  f"{100 * stats['max_rel_deviation']:.4f}%, "
                  f"{stats['cells_rounding_to_paper']}/{stats['cells']} round to the printed value")
    suffixes = ".md, .json" + ("" if args.no_plot else ", .png")
    print(f"wrote {args.out}{{{suffixes}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

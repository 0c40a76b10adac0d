"""One SFT step of a LLaDA-architecture network: full fine-tuning against LoRA, each with and without gradient
checkpointing, side by side in one run: tokens/s and peak memory.

    python -m benchmarks.bench_sft_step --device cuda --preset llada-1b --batch 8 --length 512 --steps 20 --warmup 5 \
        --out docs/results/sft_step_gpu                     # tools/device/device_sft_step.sh: one device call
    python -m benchmarks.bench_sft_step --device cpu --preset reduced --batch 4 --length 256 --steps 8 --warmup 2 \
        --out docs/results/sft_step_cpu

What fine-tuning LLaDA costs decides how it is run (`experiment=llada_sft`: LoRA or full, `sft.gradient_checkpointing`):
the four cases run in this one process on the same batch of random tokens, the same noise and the same seeded
weights, each after the last one's memory is freed; the page gives each case's rate and peak memory over full
fine-tuning without checkpointing. A case that runs out of memory is recorded as such and the rest run. See
`benchmarks.sft_step` for the step and how it is measured.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.sft_step import CASES, PRESETS, Setup, measure_case, parameter_count, sft_batch
from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp
from mdmkit.models.llm.lora import LORA_TARGETS


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default=None, choices=list(PRESETS),
                        help="the network's shape (default: llada-1b on a GPU, reduced on a CPU)")
    parser.add_argument("--batch", type=positive_int, default=None, help="rows per step (default: 8 GPU, 4 CPU)")
    parser.add_argument("--length", type=positive_int, default=None, help="tokens per row (default: 512 GPU, 256 CPU)")
    parser.add_argument("--lora-r", type=positive_int, default=16)
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps per case (the median is kept)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per case after the first")
    parser.add_argument("--dtype", default=None, choices=["float32", "bf16"],
                        help="bf16: bf16 autocast, full fine-tuning on float32 master weights, LoRA's frozen base "
                             "made in bf16 (default on a GPU); float32: everything in float32 (default on a CPU)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help="page prefix (default docs/results/sft_step_gpu on a GPU, sft_step_cpu on a CPU)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    args.preset = args.preset or ("llada-1b" if gpu else "reduced")
    args.batch, args.length = args.batch or (8 if gpu else 4), args.length or (512 if gpu else 256)
    args.dtype = args.dtype or ("bf16" if gpu else "float32")
    args.out = args.out or Path(f"docs/results/sft_step_{'gpu' if gpu else 'cpu'}")
    return args


def case_name(row: dict[str, Any]) -> str:
    method = "full" if row["method"] == "full" else f"LoRA r{row['lora_r']}"
    return method + (" + checkpointing" if row["checkpointing"] else "")


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured row's tokens/s and peak memory over full fine-tuning without checkpointing."""
    base = next((r for r in rows if (r["method"], r["checkpointing"]) == ("full", False) and "error" not in r), None)
    for row in rows:
        if base is not None and "error" not in row:
            row["tokens_per_s_vs_full"] = row["tokens_per_s"] / base["tokens_per_s"]
            peaks = row["peak_bytes"], base["peak_bytes"]
            row["peak_vs_full"] = None if None in peaks else peaks[0] / peaks[1]


def _cell(value: Any, form: str) -> str:
    return "" if value is None else format(value, form)


def _count(number: int) -> str:
    return f"{number / 1e9:.3f}B" if number >= 1e9 else f"{number / 1e6:.1f}M"


def markdown(record: dict[str, Any], rows: list[dict[str, Any]], figure_name: str) -> list[str]:
    setup, net = record["setup"], record["network"]
    table = []
    for r in rows:
        if "error" in r:
            table.append([case_name(r), r.get("trainable_parameters", ""), r["error"], "", "", "", "", ""])
            continue
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**30
        table.append([case_name(r), f"{r['trainable_parameters'] / 1e6:.2f}M", f"{r['tokens_per_s']:.0f}",
                      _cell(r.get("tokens_per_s_vs_full"), ".2f"), f"{r['step_s']:.3f}", _cell(peak, ".2f"),
                      _cell(r.get("peak_vs_full"), ".2f"), f"{r['saved_bytes'] / 2**30:.2f}"])
    bf16 = setup["dtype"] == "bf16"
    dtypes = {(r["method"], r["trainable_dtype"], r["frozen_dtype"]) for r in rows if "error" not in r}
    weights = "; ".join(f"{m}: trained weights {t}" + (f", frozen {f}" if f else "") for m, t, f in sorted(dtypes))
    memory = ("`torch.cuda.max_memory_allocated` over the case" if setup["device"] == "cuda" else
              "the growth of the process's peak resident set (Linux VmHWM, reset at the case's start) over the case")
    return [
        f"# One SFT step: full fine-tuning against LoRA, gradient checkpointing off and on ({record['device']})", "",
        f"Made by `{record['command']}` on {record['date']} (commit {str(record.get('git_commit', ''))[:12]}).", "",
        (f"Network: mdmkit's `DiffusionLM`, preset `{setup['preset']}`: **{_count(record['parameters'])} "
         f"parameters** (d_model {net['d_model']}, {net['n_layers']} layers, {net['n_heads']} heads of "
         f"{net['d_model'] // net['n_heads']}, {net['n_kv_heads']} kv heads, MLP {net['mlp_hidden']}, vocabulary "
         f"{net['vocab_size']}), seeded random weights. Batch {setup['batch']} x {setup['length']} tokens, random, "
         "the first quarter of each row a prompt (never masked), the rest the answer. A step: LLaDA's SFT loss "
         "(t ~ U(0.001, 1) per row, answer tokens masked with probability t, cross-entropy / t / answer length), "
         "backward, gradients clipped at norm 1, AdamW over the trained weights, gradients cleared. LoRA: "
         f"rank {setup['lora_r']}, alpha 32 on {', '.join(LORA_TARGETS)} of every block, every other weight "
         "frozen (`mdmkit.models.llm.lora.add_lora`). Precision: "
         + ("bf16 autocast; " if bf16 else "float32, no autocast; ") + weights + "."), "",
        (f"tokens/s: batch x length over the median of {setup['steps']} timed steps (after the first and "
         f"{setup['warmup']} warm-up steps), every token counted. Peak memory: {memory}, which builds its own "
         "network: weights, gradients, AdamW's moments and activations. Saved for backward: the tensors autograd "
         "keeps at the end of a forward, weights aside (exact; under bf16 autocast it counts the weights' bf16 "
         "copies). `x full`: over full fine-tuning without checkpointing. The machine's 1-minute load average at "
         f"the start: {record['load_average']:.1f} on {record['cpus']} CPUs."), "",
        markdown_table(["case", "trained parameters", "tokens/s", "x full", "step s", "peak GiB", "x full",
                        "saved for backward GiB"], table, "lrrrrrrr"), "",
        f"![tokens/s and peak memory per case]({figure_name})", "",
        ("LoRA still runs the whole backward through the frozen weights (the activations' gradients); what it saves "
         "is the frozen matrices' weight gradients, their AdamW moments and their update. Checkpointing keeps each "
         "block's input only and recomputes the block in backward: one more forward of the blocks (not of the "
         "output layer) for less activation memory."), "",
    ]


def _short(error: str) -> str:
    return "OOM" if error == "out of memory" else "not run" if error.startswith("not run") else "failed"


def figure(rows: list[dict[str, Any]], title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    names = [case_name(r).replace(" + ", "\n+ ") for r in rows]
    for axis, key, scale, label, ratio in ((left, "tokens_per_s", 1.0, "tokens / s", "tokens_per_s_vs_full"),
                                           (right, "peak_bytes", 2**-30, "peak memory (GiB)", "peak_vs_full")):
        values = [(r.get(key) or 0) * scale for r in rows]
        bars = axis.bar(names, values, color=["#4c72b0", "#8da0cb", "#dd8452", "#f2b48c"][:len(rows)])
        notes = [_short(r["error"]) if "error" in r else "" if r.get(ratio) is None else f"{r[ratio]:.2f}x"
                 for r in rows]
        axis.bar_label(bars, notes, fontsize=8)
        axis.set(ylabel=label, title=label)
        axis.grid(axis="y", alpha=0.3)
        axis.tick_params(axis="x", labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    config, device = PRESETS[args.preset], torch.device(args.device)
    setup = Setup(config, device, args.batch, args.length, args.lora_r, args.steps, args.warmup, args.dtype == "bf16")
    tokens, answer_mask = sft_batch(config, args.batch, args.length)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    record = {"command": command_line(__file__, argv), **stamp(), "device": name, "threads": torch.get_num_threads(),
              "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
              "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "network": asdict(config), "parameters": parameter_count(config)}
    try:  # imported before the cases, not in the first LoRA case's memory window
        import peft  # noqa: F401
    except ImportError:
        pass  # the LoRA cases record it; full fine-tuning runs

    page, rows, started = Page(args.out), [], time.monotonic()
    for method, checkpointing in CASES:
        keys = {"method": method, "checkpointing": checkpointing, "lora_r": args.lora_r if method == "lora" else None}
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            rows.append({**keys, "error": f"not run (--budget-s {args.budget_s:g} spent)"})
        else:
            try:
                rows.append(measure_case(setup, method, checkpointing, tokens, answer_mask))
            except torch.OutOfMemoryError:
                rows.append({**keys, "error": "out of memory"})
            except ImportError as error:  # no peft (mdmkit's `sft` extra) where the LoRA cases run
                rows.append({**keys, "error": f"ImportError: {error}"})
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(rows[-1], flush=True)
        add_ratios(rows)  # the page after every case: a run cut short keeps what it measured
        title = f"{args.preset} ({_count(record['parameters'])}), batch {args.batch} x {args.length}: {name}"
        written = page.write(markdown=markdown(record, rows, page.name(".png")), data={**record, "rows": rows},
                             figure=figure(rows, title))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    run_script(main, "bench_sft_step")

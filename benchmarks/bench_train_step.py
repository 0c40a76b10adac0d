"""Training throughput of a run's config, eager against torch.compile'd, over batch sizes, side by side in one run.

    python -m benchmarks.bench_train_step experiment=sudoku_paper --device cuda --batch-sizes 512 1024 \
        --compile off on reduce-overhead --out docs/results/train_step_sudoku_paper_gpu
    python -m benchmarks.bench_train_step experiment=sudoku_paper --device cpu --batch-sizes 32 64 --seconds 20 \
        --out docs/results/train_step_sudoku_paper_cpu

A device call is a fixed length of time, so steps per second decide how far a paper-scale leg trains (issue 20).
Every (batch size, `compile` setting) pair is timed in this one process on the test split's examples (the content
does not change the arithmetic) with `benchmarks.train_throughput`; the page gives each rate and its ratio to eager
at the same batch size. Positional arguments are train.py overrides; precision follows the config's trainer (bf16
autocast for bf16-mixed, on a GPU only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from hydra import compose, initialize_config_module

from benchmarks.train_throughput import time_training_steps
from mdmkit.analysis.pages import Page, command_line, markdown_table, run_script, stamp
from mdmkit.core.config import to_container
from mdmkit.core.devices import resolve_device
from mdmkit.io.checkpoint import build_task
from mdmkit.training.run_config import COMPILE_MODES

_SETTINGS = {"off": False, "on": True}  # --compile values; any other is a torch.compile mode
_LABELS = {"off": "eager", "on": "torch.compile"}


def run_config(overrides: list[str]) -> dict[str, Any]:
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        return to_container(compose(config_name="train", overrides=overrides))


def figure(rows: list[dict[str, Any]], title: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for setting in dict.fromkeys(r["compile"] for r in rows):
        points = sorted((r["batch_size"], r["examples_per_s"]) for r in rows if r["compile"] == setting)
        ax.plot(*zip(*points), marker="o", label=_LABELS.get(setting, f"torch.compile({setting})"))
    ax.set(xscale="log", xlabel="batch size", ylabel="training examples / s", title=title)
    ax.set_ylim(bottom=0)
    ax.minorticks_off()
    sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(sizes, labels=[str(size) for size in sizes])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. experiment=sudoku_paper")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default: the config's")
    parser.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on", *COMPILE_MODES[1:]],
                        help="settings of train.py's `compile` to time: off, on, or a torch.compile mode")
    parser.add_argument("--seconds", type=float, default=15.0, help="timed seconds per setting (after warm-up)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, required=True, help="page prefix, e.g. docs/results/train_step_gpu")
    args = parser.parse_args(argv)

    config = run_config(args.overrides)
    if config.get("indicator") is not None:  # it would time the experiment's base MDM config, not the indicator
        parser.error("an indicator experiment trains on recorded trajectories: this times MDM training steps only")
    device = resolve_device(args.device)
    bf16 = device.type == "cuda" and str(config["trainer"].get("precision")).startswith("bf16")
    pool = build_task(config).load_test()
    batch_sizes = args.batch_sizes or [config["data"]["batch_size"]]
    rows, failed = [], []
    for batch_size in batch_sizes:
        for setting in args.compile:
            compiled = _SETTINGS.get(setting, setting)
            try:
                rate = time_training_steps({**config, "compile": compiled}, pool, batch_size, device, bf16,
                                           args.seconds)
            except Exception as error:  # noqa: BLE001 -- out of memory, a compile this torch cannot do: the rest run
                reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
                failed.append({"batch_size": batch_size, "compile": setting, "error": reason})
                print(f"batch {batch_size:5d} compile {setting:>15}: failed ({reason})", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            rows.append({"compile": setting, **rate.row()})
            print(f"batch {batch_size:5d} compile {setting:>15}: {rate.steps_per_s:7.2f} steps/s, "
                  f"{rate.examples_per_s:9.0f} examples/s, first step {rate.first_step_s:5.1f} s", flush=True)
    if not rows:
        raise SystemExit(f"every setting failed; first: {failed[0]['error']}")
    for row in rows:
        eager = next((r for r in rows if r["batch_size"] == row["batch_size"] and r["compile"] == "off"), None)
        row["vs_eager"] = row["examples_per_s"] / eager["examples_per_s"] if eager else None

    command = command_line(__file__, sys.argv[1:] if argv is None else argv)
    name = config["run_name"]
    table = markdown_table(
        ["batch", "compile", "steps/s", "examples/s", "vs eager", "model TFLOP/s", "first step (s)", "peak GiB"],
        [[r["batch_size"], r["compile"], f"{r['steps_per_s']:.2f}", f"{r['examples_per_s']:.0f}",
          "" if r["vs_eager"] is None else f"{r['vs_eager']:.2f}x", f"{r['model_tflops']:.1f}",
          f"{r['first_step_s']:.1f}", "" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"]
         for r in rows], align="rlrrrrrr")
    meta = stamp()
    markdown = [
        f"# Training throughput: {name} on {meta['machine']}", "",
        f"`{command}`", "",
        (f"{rows[0]['parameters'] / 1e6:.2f}M parameters, {rows[0]['seq_len']} tokens per example, "
         f"{'bf16 autocast' if bf16 else 'float32'}; each setting timed for {args.seconds:g} s after 3 warm-up "
         "steps (benchmarks/train_throughput.py: the training step without Lightning's loop). Model TFLOP/s is "
         "6 x parameters x tokens per second."), "",
        table, "",
        *[f"- batch {f['batch_size']}, compile {f['compile']}: failed, `{f['error']}`" for f in failed],
        *([""] if failed else []),
        f"![examples per second]({Page(args.out).name('.png')})", "",
        f"Made {meta['date']} at commit {meta['git_commit']}.",
    ]
    written = Page(args.out).write(markdown=markdown, figure=figure(rows, f"{name}: {meta['machine']}"),
                                   data={"command": command, "config": name, **meta, "rows": rows,
                                         "failed": failed})
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    run_script(main, "bench_train_step.py")

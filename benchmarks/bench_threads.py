"""Sampling time against torch's thread count, on an idle machine and beside busy processes.

    python -m benchmarks.bench_threads                          # docs/results/threads.{json,md,png}
    python -m benchmarks.bench_threads --limit 40 --repeats 1   # smoke run

One evaluation row (the committed Sudoku model's test split, Top-1 and EB) is sampled with torch's intra-op
threads set to each count, trials interleaved across the counts, first on the idle machine and then with
`--busy` processes spinning beside it (a loaded machine: other jobs, or a second rank). The page gives each
count's median seconds and its ratio to torch's default (one thread per core).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mdmkit import api
from mdmkit.analysis.pages import Page, command_line, markdown_table, stamp
from mdmkit.evaluation.evaluate import evaluate_test_split
from mdmkit.io.checkpoint import TrainedModel

ROOT = Path(__file__).resolve().parents[1]

SAMPLERS = {"topk k=1": ("topk", {}), "eb gamma=0.1": ("eb", {"gamma": 0.1})}


def spin(stop: Any) -> None:
    """A busy core until `stop` (a multiprocessing Event) is set."""
    while not stop.is_set():
        pass


def measure(checkpoint: Path, limit: int, counts: list[int], repeats: int, busy: int) -> dict[str, dict]:
    """{sampler: {threads: [seconds of each trial]}} with `busy` spinning processes beside the sampling."""
    trained = TrainedModel(checkpoint)
    network, task = trained.network(), trained.task
    samplers = {name: api.sampler(preset, **fields) for name, (preset, fields) in SAMPLERS.items()}
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
    for process in spinners:
        process.start()
    seconds: dict[str, dict] = {name: {n: [] for n in counts} for name in samplers}
    try:
        for _ in range(repeats):
            for name, sampler in samplers.items():
                for n in counts:
                    torch.set_num_threads(n)
                    start = time.perf_counter()
                    evaluate_test_split(network, task, sampler, limit, 256, 0)
                    seconds[name][n].append(time.perf_counter() - start)
    finally:
        stop.set()
        for process in spinners:
            process.join()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "sudoku_mdm.pt")
    parser.add_argument("--limit", type=int, default=200, help="test puzzles per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes of the loaded run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "threads")
    args = parser.parse_args()
    default = torch.get_num_threads()
    counts = sorted({1, 2, default})
    runs = {"idle": measure(args.checkpoint, args.limit, counts, args.repeats, 0),
            f"{args.busy} busy processes": measure(args.checkpoint, args.limit, counts, args.repeats, args.busy)}
    torch.set_num_threads(default)

    rows, data = [], {"default_threads": default, "cores": os.cpu_count(), "limit": args.limit,
                      "repeats": args.repeats, "machine": stamp(), "runs": {}}
    for machine, by_sampler in runs.items():
        for name, by_count in by_sampler.items():
            medians = {n: statistics.median(trials) for n, trials in by_count.items()}
            data["runs"].setdefault(machine, {})[name] = {str(n): trials for n, trials in by_count.items()}
            for n, median in medians.items():
                rows.append([machine, name, n, f"{median:.2f}", f"{medians[default] / median:.2f}x"])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.5), dpi=120, sharey=True)
    for ax, (machine, by_sampler) in zip(axes, runs.items(), strict=True):
        width = 0.8 / len(counts)
        for i, n in enumerate(counts):
            values = [statistics.median(by_sampler[name][n]) for name in SAMPLERS]
            ax.bar([j + i * width for j in range(len(SAMPLERS))], values, width, label=f"{n} thread(s)")
        ax.set_xticks([j + width * (len(counts) - 1) / 2 for j in range(len(SAMPLERS))], list(SAMPLERS))
        ax.set_title(machine)
        ax.set_ylabel(f"seconds for {args.limit} puzzles")
    axes[0].legend()
    figure.tight_layout()

    page = Page(args.out)
    markdown = [
        "# Sampling time against torch's thread count", "",
        f"![seconds per row]({page.name('.png')})", "",
        (f"One evaluation row ({args.limit} test puzzles of `{args.checkpoint.name}`, batch 256), median of "
         f"{args.repeats} interleaved trials. torch's default here: {default} thread(s) on {os.cpu_count()} "
         "cores. Ratio: the default's time over the count's (above 1: faster than the default)."), "",
        markdown_table(["machine", "sampler", "threads", "seconds", "vs default"], rows), "",
        "## Command", "", "```", command_line(__file__, sys.argv[1:]), "```",
    ]
    written = page.write(markdown=markdown, data=data, figure=figure)
    print("\n".join(markdown[4:-5]))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

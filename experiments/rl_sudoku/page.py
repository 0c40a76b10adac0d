"""The plot and table of the Sudoku RL before/after page: each checkpoint's accuracy-vs-NFE front on one test split.

Reads the rows `run.sh` appended (one per checkpoint and sampler; several files: a later file's row of the same
checkpoint and setting replaces an earlier one's), keeps the grid's (full step and threshold, confidence order),
names each checkpoint by its run (the start: `start`), and writes the plot of every checkpoint's front and the
markdown table of accuracy and NFE per sampler setting, with each trained checkpoint's change against the start.

    python -m experiments.rl_sudoku.page docs/results/rl_sudoku.jsonl --out docs/results/rl_sudoku
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mdmkit.analysis.pages import markdown_table, run_script

START = "start"
METHODS = ("grpo", "wd1", "coupled")  # the page's three runs, first; variants (other run names) after them


def label(checkpoint: str) -> str:
    """A run's checkpoint (`runs/rl_sudoku/<rl>/model.pt`) by its run's name; any other is the start."""
    path = Path(checkpoint)
    return path.parent.name if path.name == "model.pt" else START


def setting(row: dict[str, Any]) -> str:
    """The sampler setting a row measured: `full step` (Top-1) or `threshold tau=<tau>`."""
    params = row["params"]
    if "tau" in params:
        return f"threshold tau={params['tau']}"
    return "full step" if params.get("k") == 1 else f"{row['family']} {params}"


def in_grid(row: dict[str, Any]) -> bool:
    """Whether a row is one of the study's samplers: full step (Top-1) or threshold, confidence order, no oracle."""
    params = row.get("params", {})
    return row.get("kind") == "evaluate" and params.get("ordering") == "confidence" and \
        (row["family"] == "threshold-confidence" or (row["family"] == "topk-confidence" and params.get("k") == 1))


def collect(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """checkpoint label -> setting -> (accuracy, mean NFE) over the grid's rows; a later row of the same pair
    replaces an earlier one."""
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for row in filter(in_grid, rows):
        table.setdefault(label(row["checkpoint"]), {})[setting(row)] = (row["accuracy"], row["nfe_mean"])
    return table


def front_at(points: Iterable[tuple[float, float]], nfe: float) -> float | None:
    """The accuracy of a front of (accuracy, NFE) points at `nfe`, linear between its neighbours; None outside."""
    ordered = sorted((n, a) for a, n in points)
    for (n0, a0), (n1, a1) in itertools.pairwise(ordered):
        if n0 <= nfe <= n1:
            return a0 if n1 == n0 else a0 + (a1 - a0) * (nfe - n0) / (n1 - n0)
    return None


def table_markdown(table: dict[str, dict[str, tuple[float, float]]], order: Sequence[str],
                   front: Iterable[tuple[float, float]] = ()) -> str:
    """Accuracy (NFE) per setting and checkpoint, with each trained checkpoint's points against the start at the
    same setting and, where its NFE moved and `front` (the start's (accuracy, NFE) points) spans it, at the same
    NFE (linear between the front's points)."""
    front = list(front)
    settings = sorted({s for results in table.values() for s in results}, key=lambda s: (s != "full step", s))
    header = ["sampler", *[f"{name}: acc % (NFE)" for name in order]]
    rows = []
    for name in settings:
        cells: list[str] = [name]
        base = table.get(START, {}).get(name)
        for checkpoint in order:
            result = table.get(checkpoint, {}).get(name)
            if result is None:
                cells.append("—")
                continue
            text = f"{100 * result[0]:.1f} ({result[1]:.1f})"
            if checkpoint != START and base is not None:
                text += f" {100 * (result[0] - base[0]):+.1f}"
                level = front_at(front, result[1]) if abs(result[1] - base[1]) >= 0.05 else None
                text += f"; {100 * (result[0] - level):+.1f} at equal NFE" if level is not None else ""
            cells.append(text)
        rows.append(cells)
    return markdown_table(header, rows, "l" + "r" * len(order))


def training_markdown(runs: Path, window: int = 10) -> str:
    """Each run's training logs (`<runs>/<name>/csv/version_0/metrics.csv`): the rollouts' verified and per-cell
    rewards, the spread within groups and the forwards per rollout, over its first and last `window` steps."""
    header = ["run", "steps", "solved (first → last)", "cells right", "reward std in groups", "NFE per rollout", "KL"]
    rows = []
    for path in sorted(runs.glob("*/csv/version_0/metrics.csv")):
        logged = [row for row in csv.DictReader(path.open()) if row.get("rl/reward")]
        if not logged:
            continue

        def mean(key: str, part: list[dict[str, str]]) -> float:
            return sum(float(row[key]) for row in part) / len(part)

        first, last = logged[:window], logged[-window:]
        rows.append([path.parents[2].name, len(logged),
                     *(f"{mean(key, first):.2f} → {mean(key, last):.2f}" for key in
                       ("rl/reward/verified", "rl/reward/cells", "rl/reward_std", "rl/nfe")),
                     f"{mean('rl/kl', last):.4f}" if logged[-1].get("rl/kl") else "—"])
    return markdown_table(header, rows, "lrrrrrr")


def plot(table: dict[str, dict[str, tuple[float, float]]], order: Sequence[str], path: Path,
         front: Sequence[tuple[float, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for checkpoint in order:
        points = sorted((nfe, 100 * accuracy) for accuracy, nfe in table[checkpoint].values())
        for ax in axes:
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-" if checkpoint == START else "s--",
                     label=checkpoint, lw=2 if checkpoint == START else 1.2)
    wider = sorted((nfe, 100 * accuracy) for accuracy, nfe in front)
    axes[1].plot([p[0] for p in wider], [p[1] for p in wider], ":", color="grey", label="start, all its thresholds")
    axes[0].set_xscale("log")
    axes[0].set_title("accuracy vs NFE (full step at the right)")
    axes[1].set_xlim(5.8, 7.6)
    axes[1].set_ylim(35, 95)
    axes[1].set_title("the fast end (threshold)")
    for ax in axes:
        ax.set_xlabel("NFE per puzzle (mean)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="results files, later ones replacing earlier rows")
    parser.add_argument("--out", type=Path, required=True, help="output prefix: writes <out>.png, prints the table")
    parser.add_argument("--runs", type=Path, default=Path("runs/rl_sudoku"), help="the runs' directories (logs)")
    args = parser.parse_args()
    rows = [json.loads(line) for path in args.results for line in path.read_text().splitlines() if line.strip()]
    table = collect(rows)
    front = list(table.get(START, {}).values())  # all of the start's rows, also settings the runs were not scored on
    trained = {setting for name, results in table.items() if name != START for setting in results}
    if trained:  # the start's other rows (another page's grid) stay out
        table[START] = {setting: result for setting, result in table.get(START, {}).items() if setting in trained}
    order = [START, *(name for name in METHODS if name in table),
             *sorted(name for name in table if name != START and name not in METHODS)]
    plot(table, order, args.out.with_suffix(".png"), front)
    print(table_markdown(table, order, front))
    print()
    print(training_markdown(args.runs))


if __name__ == "__main__":
    run_script(main, "rl_sudoku page")

"""Accuracy against NFE for a masked and a uniform-noise model of one task: the plot (written) and the table
(printed) of docs/results/uniform_vs_masked_sudoku.md, from the rows of `evaluate.py sweep=uniform_vs_masked_*`.

    python scripts/uniform_vs_masked_page.py ROWS.jsonl --out docs/results/uniform_vs_masked_sudoku
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def objective_of(row: dict[str, Any]) -> str:
    """`masked` or `uniform`: the objective the row's checkpoint was trained with."""
    target = str(((row.get("train_config") or {}).get("objective") or {}).get("_target_", ""))
    return "uniform" if target.endswith("UniformDiffusionLoss") else "masked"


def setting(row: dict[str, Any]) -> str:
    """The rule's knob and, off the default schedule, the temperatures."""
    params = dict(row.get("params") or {})
    params.update(params.pop("rule", None) or {})  # a revisable sampler's rule: its own knob
    shown = {k: v for k, v in params.items() if k in ("gamma", "k", "tau")}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))


def curves(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows by `objective: family` (the cold schedule apart), each curve sorted by NFE."""
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cold = (row.get("params") or {}).get("t_max") not in (None, 0.8)
        grouped[f"{objective_of(row)}: {row['family']}{' (t 0.1-0.05)' if cold else ''}"].append(row)
    return {name: sorted(group, key=lambda r: r["nfe_mean"]) for name, group in sorted(grouped.items())}


def table(groups: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| model: rule | setting | accuracy (95% CI) | NFE mean | NFE p50 |", "|---|---|---|---|---|"]
    for name, group in groups.items():
        for row in group:
            low, high = row.get("accuracy_ci95") or (row["accuracy"], row["accuracy"])
            lines.append(f"| {name} | {setting(row)} | {row['accuracy']:.3f} ({low:.3f}-{high:.3f}) | "
                         f"{row['nfe_mean']:.2f} | {row['nfe_median']:.0f} |")
    return "\n".join(lines)


def plot(groups: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.8))
    for name, group in groups.items():
        style = "-o" if name.startswith("masked") else "--s"
        axes.plot([r["nfe_mean"] for r in group], [r["accuracy"] for r in group], style, label=name, markersize=4)
    axes.set_xscale("log")
    axes.set_xlabel("NFE per puzzle (mean)")
    axes.set_ylabel("accuracy (solved puzzles)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix: writes the .png")
    parser.add_argument("--title", default="Sudoku: masked vs uniform-noise (revisable) at equal training")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    groups = curves([row for row in rows if row.get("kind") == "evaluate"])
    plot(groups, args.out.with_suffix(".png"), args.title)
    print(table(groups))


if __name__ == "__main__":
    main()

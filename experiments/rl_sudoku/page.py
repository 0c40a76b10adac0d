"""The plot and table of the Sudoku RL before/after page: each checkpoint's accuracy-vs-NFE front on one test split.

Reads the rows `run.sh` appended (one per checkpoint and sampler; several files: a later file's row of the same
checkpoint and setting replaces an earlier one's), keeps the grid's (full step and threshold, confidence order),
names each checkpoint by its run (the start: `start`), and writes the plot of every checkpoint's front and the
markdown table of accuracy and NFE per sampler setting, with each trained checkpoint's change against the start.

    python -m experiments.rl_sudoku.page docs/results/rl_sudoku.jsonl --out docs/results/rl_sudoku
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mdmkit.analysis.pages import markdown_table, run_script

START = "start"


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


def table_markdown(table: dict[str, dict[str, tuple[float, float]]], order: Sequence[str]) -> str:
    """Accuracy (NFE) per setting and checkpoint, with each trained checkpoint's points against the start."""
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
            cells.append(text)
        rows.append(cells)
    return markdown_table(header, rows, "l" + "r" * len(order))


def plot(table: dict[str, dict[str, tuple[float, float]]], order: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for checkpoint in order:
        points = sorted((nfe, 100 * accuracy) for accuracy, nfe in table[checkpoint].values())
        for ax in axes:
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-" if checkpoint == START else "s--",
                     label=checkpoint, lw=2 if checkpoint == START else 1.2)
    axes[0].set_xscale("log")
    axes[0].set_title("accuracy vs NFE (full step at the right)")
    axes[1].set_xlim(2, 9)
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
    args = parser.parse_args()
    rows = [json.loads(line) for path in args.results for line in path.read_text().splitlines() if line.strip()]
    table = collect(rows)
    trained = {setting for name, results in table.items() if name != START for setting in results}
    if trained:  # the start's other rows (another page's grid) stay out
        table[START] = {setting: result for setting, result in table.get(START, {}).items() if setting in trained}
    order = [START, *sorted(name for name in table if name != START)]
    plot(table, order, args.out.with_suffix(".png"))
    print(table_markdown(table, order))


if __name__ == "__main__":
    run_script(main, "rl_sudoku page")

"""One figure for the self-speculative benchmark: a panel per task, each sampler family's front.

    python scripts/speculative_figure.py docs/results/speculative_maze.jsonl:accuracy \
        docs/results/speculative_text.jsonl:spelling_accuracy --out docs/results/speculative

Each argument is a rows file written by `scripts/pareto.py --tag ...` (families carry their checkpoint's label)
and the quality metric of its y axis. Drawn: the speculative families (solid) and every family of the checkpoint
tagged `mdm` (dashed). Writes <out>.png and <out>.jsonl (every row, with its panel).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mdmkit.analysis import pareto
from mdmkit.analysis.pages import Page
from mdmkit.analysis.pareto_plot import log_nfe_axis

BASELINE_LABEL = "mdm"  # the --tag label of the same-architecture MDM; its families are drawn dashed


def read_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("panels", nargs="+", help="ROWS.jsonl:METRIC, one per panel")
    parser.add_argument("--out", required=True, help="output prefix: writes <out>.png and <out>.jsonl")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.panels), figsize=(5.2 * len(args.panels), 5.4), squeeze=False, dpi=140)
    written = []
    for ax, spec in zip(axes[0], args.panels):
        path, _, metric = spec.rpartition(":")
        try:
            raw = read_rows(Path(path))
            rows = pareto.on_axes(raw, metric, cost=True)
        except (OSError, ValueError, KeyError) as error:
            print(f"speculative_figure.py: error: {spec}: {error}", file=sys.stderr)
            return 2
        fronts = {name: front for name, front in pareto.fronts_by_family(rows).items()
                  if "speculative" in name or name.startswith(BASELINE_LABEL)}
        for index, (name, front) in enumerate(fronts.items()):
            ours = "speculative" in name
            ax.plot([p.nfe for p in front], [p.accuracy for p in front], "-" if ours else "--", marker="o",
                    markersize=3.5, color=plt.cm.tab10(index % 10), label=name, linewidth=2.0 if ours else 1.2)
        log_nfe_axis(ax)
        ax.set_title(f"{rows[0]['task']}", fontsize=11)
        ax.set_xlabel("cost (forward passes; extra causal passes at their share)", fontsize=9)
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        written += [{**r, "panel": Path(path).stem} for r in raw]
    fig.tight_layout()
    Page(Path(args.out)).write(figure=fig, rows=written)
    print(f"wrote {args.out}.png, {args.out}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())

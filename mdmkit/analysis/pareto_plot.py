"""Accuracy-vs-NFE figures of Pareto fronts (`mdmkit.analysis.pareto` computes them, this module draws them).

Kept apart from the front arithmetic so that reading and comparing results never imports matplotlib.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mdmkit.analysis.pareto import ORACLE, derive_family, fronts_by_family, overall_front, points

# Fixed colours for the usual families so that a family keeps its colour from plot to plot.
_KNOWN_FAMILIES = (
    "topk-confidence", "eb-entropy", "eb-confidence", "threshold-confidence", "factor-confidence",
    "p2-confidence", "steps-confidence", "dreamsteps-entropy", "dreamsteps-confidence",
    "revealall-confidence",
)


def family_colors(names: Iterable[str]) -> dict[str, Any]:
    """A colour per family: fixed ones for the usual families, the rest from tab20 by a stable hash; oracle
    black."""
    import matplotlib

    tab10 = matplotlib.colormaps["tab10"].colors
    tab20 = matplotlib.colormaps["tab20"].colors
    colors: dict[str, Any] = {}
    for name in names:
        if name == ORACLE:
            colors[name] = "black"
        elif name in _KNOWN_FAMILIES:
            colors[name] = tab10[_KNOWN_FAMILIES.index(name) % len(tab10)]
        else:
            colors[name] = tab20[zlib.crc32(name.encode()) % len(tab20)]
    return colors


def log_nfe_axis(ax: Any) -> None:
    """A log x axis labelled with plain numbers (10, 20, 50 rather than 2x10^1), minor labels at 2 and 5."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: f"{x:g}" if f"{x:.0e}"[0] in "25" else ""))


def plot_fronts(rows: Iterable[Mapping[str, Any]], path: str | Path, title: str, log_nfe: bool = True,
                baseline_family: str | None = None, xlabel: str = "NFE (mean forward passes per example)",
                ylabel: str = "accuracy") -> Path:
    """Accuracy vs NFE: every run as a faint point, each family's front as a line with markers (95% CI bars
    where rows have `accuracy_ci95`), the overall front highlighted underneath, the oracle floor dashed black.
    Saves a PNG (dpi 150) and returns its path. Log NFE axis falls back to linear if an NFE is <= 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    fronts = fronts_by_family(rows)
    colors = family_colors(fronts)
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    overall = overall_front(rows)
    if len(overall) > 1:
        ax.plot([p.nfe for p in overall], [p.accuracy for p in overall], color="gold", linewidth=9,
                alpha=0.45, solid_capstyle="round", zorder=1, label="overall front")
    elif overall:
        ax.scatter([overall[0].nfe], [overall[0].accuracy], s=400, color="gold", alpha=0.45, zorder=1,
                   label="overall front")
    for name, front in fronts.items():
        color = colors[name]
        everything = points(r for r in rows if derive_family(r) == name)
        is_oracle = name == ORACLE
        ax.scatter([p.nfe for p in everything], [p.accuracy for p in everything], color=color, alpha=0.2,
                   s=18, marker="x" if is_oracle else "o", zorder=2, linewidths=1)
        if not front:
            continue
        xs, ys = [p.nfe for p in front], [p.accuracy for p in front]
        if is_oracle:
            ax.plot(xs, ys, linestyle="--", color="black", marker="x", markersize=6, linewidth=1.4, zorder=4,
                    label="oracle floor")
            continue
        label = f"{name} (baseline)" if name == baseline_family else name
        ax.plot(xs, ys, color=color, marker="o", markersize=5,
                linewidth=2.6 if name == baseline_family else 1.6, zorder=3, label=label)
        for p in front:
            ci = p.payload.get("accuracy_ci95") if isinstance(p.payload, Mapping) else None
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
                ax.plot([p.nfe, p.nfe], [ci[0], ci[1]], color=color, alpha=0.35, linewidth=1, zorder=2)
    nfes = [p.nfe for p in points(rows)]
    if log_nfe and nfes and min(nfes) > 0:
        log_nfe_axis(ax)
    ax.set_xlabel(xlabel + (", log scale" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(3, len(handles)),
                  frameon=False, fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path

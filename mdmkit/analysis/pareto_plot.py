"""Accuracy-vs-NFE figures of the Pareto fronts `mdmkit.analysis.pareto` computes, each meant to go into a draft as
it is (`plot_fronts` lists what it shows)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mdmkit.analysis.pareto import fronts_by_family, overall_front, points
from mdmkit.io.naming import ORACLE, derive_family, row_settings, swept_settings

# Fixed colours for the usual families so that a family keeps its colour from plot to plot.
_KNOWN_FAMILIES = (
    "topk-confidence", "eb-entropy", "eb-confidence", "threshold-confidence", "factor-confidence",
    "p2-confidence", "steps-confidence", "dreamsteps-entropy", "dreamsteps-confidence",
    "revealall-confidence",
)
OVERALL_COLOR = "gold"  # the band under the overall front
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", "h", ">", "p", "*")
LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":")
# Where a family's point labels sit relative to the point (offset in points, alignment): families alternate, so
# labels of fronts that run close together fall on different sides.
_LABEL_PLACES = (((4, 3), "left", "bottom"), ((4, -3), "left", "top"), ((-4, 3), "right", "bottom"),
                 ((-4, -3), "right", "top"))
_CHECKPOINT_SUFFIXES = (".pt", ".ckpt", ".safetensors", ".bin", ".pth")


def family_colors(names: Iterable[str]) -> dict[str, Any]:
    """A colour per family: fixed ones for the usual families, the rest by a stable hash from dark, saturated
    colours (Dark2 without its grey, tab20b's darkest, a few more: labels in pale colours would not read), moved
    on to the next one unlike every colour the plot has already (the overall front's gold included); oracle
    black."""
    import matplotlib

    tab10, dark2, tab20b = (  # ListedColormaps: `colormaps[...]` is typed Colormap, which has no colours
        matplotlib.colormaps[name].colors for name in ("tab10", "Dark2", "tab20b"))  # type: ignore[attr-defined]
    hashed = [*dark2[:7], *tab20b[::4],
              *(matplotlib.colors.to_rgb(c) for c in ("#17becf", "#bcbd22", "#000080", "#008b8b", "#4d4d4d"))]
    names = list(names)
    colors: dict[str, Any] = {name: tab10[_KNOWN_FAMILIES.index(name) % len(tab10)]
                              for name in names if name in _KNOWN_FAMILIES}
    colors.update({ORACLE: "black"} if ORACLE in names else {})
    for name in names:
        if name not in colors:  # its hashed colour, or the next one unlike the colours the plot has already
            start = zlib.crc32(name.encode()) % len(hashed)
            taken = [matplotlib.colors.to_rgb(c) for c in (*colors.values(), OVERALL_COLOR)]
            candidates = [hashed[(start + i) % len(hashed)] for i in range(len(hashed))]
            colors[name] = next((c for c in candidates if all(math.dist(c, t) > 0.25 for t in taken)),
                                next((c for c in candidates if c not in taken), hashed[start]))
    return {name: colors[name] for name in names}


def family_styles(names: Sequence[str]) -> dict[str, tuple[str, Any]]:
    """A (marker, line style) per family, in the order given, no two alike: colours may coincide (hashed ones) and
    fronts may lie on each other, shapes and dashes still tell them apart. Oracle: "x", dashed."""
    styles: dict[str, tuple[str, Any]] = {}
    number = 0
    for name in names:
        if name == ORACLE:
            styles[name] = ("x", "--")
            continue
        # markers all differ for the first len(MARKERS) families, (marker, line style) pairs for 4x as many
        styles[name] = (MARKERS[number % len(MARKERS)],
                        LINESTYLES[(number + number // len(MARKERS)) % len(LINESTYLES)])
        number += 1
    return styles


def plain_number(x: float) -> str:
    """A tick value as people write it: 5, 20, 0.5, 150 (never 2×10⁰ or 1e+02)."""
    if x >= 1 and float(x).is_integer():
        return str(int(x))
    return f"{x:.3g}"


def log_nfe_axis(ax: Any, axis: str = "x") -> None:
    """A log axis labelled with plain numbers (10, 20, 50 rather than 2×10^1). Minor ticks are labelled too where
    the axis spans few decades (all of 2..9 within one decade, 2, 3 and 5 within two, 2 and 5 within three), so a
    narrow range never ends up with one label or none."""
    from matplotlib.ticker import FuncFormatter

    getattr(ax, f"set_{axis}scale")("log")
    which = ax.xaxis if axis == "x" else ax.yaxis
    limits = ax.get_xlim if axis == "x" else ax.get_ylim

    def minor(x: float, _: Any) -> str:
        if x <= 0:
            return ""
        low, high = sorted(limits())
        decades = math.log10(high / low) if low > 0 else math.inf
        lead = round(x / 10 ** math.floor(math.log10(x) + 1e-9))
        if decades <= 1.0 or (decades <= 2.0 and lead in (2, 3, 5)) or (decades <= 3.0 and lead in (2, 5)):
            return plain_number(x)
        return ""

    which.set_major_formatter(FuncFormatter(lambda x, _: plain_number(x) if x > 0 else ""))
    which.set_minor_formatter(FuncFormatter(minor))


def model_name(row: Mapping[str, Any]) -> str:
    """A checkpoint as a reader knows it: `checkpoints/sudoku_mdm.pt` -> "sudoku_mdm", a hub id as it is, a model
    directory by its name; the content hash only where a row has nothing else."""
    path = str(row.get("checkpoint") or "")
    if not path:
        sha = str(row.get("checkpoint_sha") or "")
        return f"checkpoint {sha[:12]}" if sha else "unknown model"
    name = Path(path).name
    if name.endswith(_CHECKPOINT_SUFFIXES):
        return Path(name).stem
    if path.count("/") == 1 and not path.startswith((".", "/", "~")):
        return path  # a Hugging Face hub id, organisation/name
    return name or path


def plot_title(rows: Iterable[Mapping[str, Any]], what: str = "accuracy vs NFE", context: str | None = None) -> str:
    """A title naming the task(s), the model(s) and the test examples: "sudoku · sudoku_mdm: accuracy vs NFE
    (1000 test examples)"; `context` (e.g. "sweep rules_sudoku") goes in the brackets."""
    rows = list(rows)
    tasks = sorted({str(row["task"]) for row in rows if row.get("task")})
    models = sorted({model_name(row) for row in rows})
    sizes = {row.get("n") for row in rows if row.get("kind") != ORACLE}
    head = " · ".join(part for part in (", ".join(tasks),
                                        " vs ".join(models) if len(models) <= 3 else f"{len(models)} models") if part)
    notes = [context] if context else []
    if len(sizes) == 1 and isinstance(next(iter(sizes)), int):
        notes.append(f"{next(iter(sizes))} test examples")
    return f"{head}: {what}" + (f" ({', '.join(notes)})" if notes else "")


def point_label(row: Mapping[str, Any], swept: Sequence[str]) -> str:
    """A front point's annotation: the values of the swept settings ("0.001"; "8, 0.0" for two)."""
    settings = row_settings(row)
    return ", ".join(str(settings.get(key, "—")) for key in swept)


def _legend_name(name: str, rows: Sequence[Mapping[str, Any]], swept: Sequence[str], baseline: bool) -> str:
    shown = "oracle floor" if name == ORACLE else name
    if swept:
        shown += f": {', '.join(swept)}"  # the points say its values
    elif rows:
        fixed = ", ".join(f"{key}={value}" for key, value in row_settings(rows[0]).items())
        shown += f": {fixed[:48] + '…' if len(fixed) > 49 else fixed}" if fixed else ""
    return shown + (" (baseline)" if baseline else "")


def draw_fronts(rows: Iterable[Mapping[str, Any]], title: str | None = None, log_nfe: bool = True,
                baseline_family: str | None = None, xlabel: str = "NFE (mean forward passes per example)",
                ylabel: str = "accuracy", annotate: bool = True) -> Any:
    """The figure of `plot_fronts`, not saved (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    fronts = fronts_by_family(rows)
    colors, styles = family_colors(fronts), family_styles(list(fronts))
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    overall = overall_front(rows)
    if len(overall) > 1:
        ax.plot([p.nfe for p in overall], [p.accuracy for p in overall], color=OVERALL_COLOR, linewidth=9,
                alpha=0.4, solid_capstyle="round", zorder=1, label="overall front")
    elif overall:
        ax.scatter([overall[0].nfe], [overall[0].accuracy], s=400, color=OVERALL_COLOR, alpha=0.4, zorder=1,
                   label="overall front")
    labels: list[Any] = []
    for number, (name, front) in enumerate(fronts.items()):
        color, (marker, linestyle) = colors[name], styles[name]
        own = [r for r in rows if derive_family(r) == name]
        everything = points(own)
        ax.scatter([p.nfe for p in everything], [p.accuracy for p in everything], color=color, alpha=0.2,
                   s=16, marker=marker, zorder=2, linewidths=1)
        if not front:
            continue
        swept = swept_settings(own)
        xs, ys = [p.nfe for p in front], [p.accuracy for p in front]
        is_baseline = name == baseline_family
        ax.plot(xs, ys, color=color, marker=marker, markersize=5.5, linestyle=linestyle, alpha=0.8,
                markerfacecolor=color if number % 2 == 0 else "white", markeredgewidth=1.2,
                linewidth=2.6 if is_baseline else 1.6, zorder=4 if name == ORACLE else 3,
                label=_legend_name(name, own, swept, is_baseline))
        for p in front:
            ci = p.payload.get("accuracy_ci95") if isinstance(p.payload, Mapping) else None
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
                ax.plot([p.nfe, p.nfe], [ci[0], ci[1]], color=color, alpha=0.3, linewidth=1, zorder=2)
        if annotate and swept:
            offset, ha, va = _LABEL_PLACES[number % len(_LABEL_PLACES)]
            for p in front:
                if isinstance(p.payload, Mapping):
                    labels.append(ax.annotate(point_label(p.payload, swept), (p.nfe, p.accuracy), xytext=offset,
                                              textcoords="offset points", ha=ha, va=va, fontsize=6.5, color=color,
                                              alpha=0.9, zorder=5))
    nfes = [p.nfe for p in points(rows)]
    if log_nfe and nfes and min(nfes) > 0 and max(nfes) / min(nfes) >= 3:
        log_nfe_axis(ax)
    else:  # linear: plain numbers too, no offset or 1e3 multiplier
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_xlabel(xlabel + (", log scale" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else plot_title(rows, f"{ylabel} vs NFE"))
    ax.grid(True, which="both", alpha=0.25)
    handles, names = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(3, len(handles)),
                  frameon=False, fontsize=8.5)
    _spread(fig, labels)
    return fig


def _spread(fig: Any, labels: Sequence[Any]) -> None:
    """Move point labels off each other: each takes the first of the four places around its point (starting from
    its family's) where it overlaps no label placed before it, and stays where it was drawn if all are taken."""
    if not labels:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()

    def put(label: Any, place: tuple[tuple[int, int], str, str]) -> Any:
        label.xyann = place[0]
        label.set(ha=place[1], va=place[2])
        return label.get_window_extent(renderer)

    placed: list[Any] = []
    for label in labels:
        first = (tuple(label.xyann), label.get_ha(), label.get_va())
        start = next((i for i, place in enumerate(_LABEL_PLACES) if place == first), 0)
        for place in (*_LABEL_PLACES[start:], *_LABEL_PLACES[:start]):
            box = put(label, place)
            if not any(box.overlaps(other) for other in placed):
                break
        else:
            box = put(label, first)
        placed.append(box)


def plot_fronts(rows: Iterable[Mapping[str, Any]], path: str | Path, title: str | None = None, **options: Any) -> Path:
    """Accuracy vs NFE: every run as a faint point, each family's front as a line with its own colour, marker and
    line style (drawn slightly transparent, so fronts that coincide stay visible; 95% CI bars where rows have
    `accuracy_ci95`; front points labelled with the swept setting's value, the legend naming it), the overall front
    highlighted underneath, the oracle floor dashed black. `title` defaults to `plot_title` (task, model, test
    examples). The NFE axis is logarithmic, ticked with plain numbers (5, 10, 20), where NFE spans a factor of 3 or
    more (linear where it spans less, or where an NFE is <= 0). `options` are `draw_fronts`'s. Saves a PNG (dpi
    150) and returns its path."""
    import matplotlib.pyplot as plt

    fig = draw_fronts(rows, title, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path

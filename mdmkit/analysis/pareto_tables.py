"""Tables of sampler results: the runs of a sweep, each family's front in one line, speedups over a baseline.

Text only (markdown, or fixed width for a terminal), so that a sweep can print them without a plotting stack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mdmkit.analysis.aup import family_aup
from mdmkit.analysis.pages import markdown_table
from mdmkit.analysis.pareto import (
    fronts_by_family,
    lowest_nfe_keeping,
    nfe_at_accuracy,
    points,
    reference_accuracy_of,
    speedup,
)
from mdmkit.io.naming import ORACLE, derive_family, family_settings, row_settings, sampler_settings, swept_settings

_SETTINGS_WIDTH = 64


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "—" if value is None else format(value, spec)


def _shown(family: str) -> str:
    return "oracle floor (reference)" if family == ORACLE else family


def _run_settings(row: Mapping[str, Any], swept: Sequence[str]) -> str:
    """A run's settings as console lines write them; one longer than `_SETTINGS_WIDTH` is cut, after moving the
    settings its family sweeps to the front (so the cut only ever takes fixed ones, which the summary table lists
    in full)."""
    settings = row_settings(row)
    text = ", ".join(f"{key}={value}" for key, value in settings.items())
    if len(text) <= _SETTINGS_WIDTH:
        return text
    ordered = [*(k for k in swept if k in settings), *(k for k in settings if k not in swept)]
    text = ", ".join(f"{key}={settings[key]}" for key in ordered)
    return text[:_SETTINGS_WIDTH - 1] + "…"


def runs_table(rows: Iterable[Mapping[str, Any]], cost: bool = False) -> str:
    """Fixed-width table of runs for a terminal, by family and NFE: the family (with the preset it came from, where
    that is more than the rule's plain option: "llada (steps-confidence)"), the settings that tell a family's runs
    apart, accuracy, NFE and, with `cost`, the full cost (NFE + extra passes such as an indicator's)."""
    rows = sorted(rows, key=lambda r: (derive_family(r), r["nfe_mean"]))
    families = [derive_family(row) for row in rows]
    swept = {name: swept_settings(r for r, f in zip(rows, families) if f == name) for name in set(families)}
    named = [(family, sampler_settings(row.get("sampler")) if family == ORACLE else _run_settings(row, swept[family]))
             for row, family in zip(rows, families)]
    family_width = max([len("family"), *(len(family) for family, _ in named)])
    settings_width = max([len("settings"), *(len(settings) for _, settings in named)])
    lines = [f"{'family':<{family_width}} {'settings':<{settings_width}} {'accuracy':>8} {'NFE':>8}"
             + (f" {'cost':>8}" if cost else "")]
    for row, (family, settings) in zip(rows, named):
        lines.append(f"{family:<{family_width}} {settings:<{settings_width}} {row['accuracy']:>8.4f} "
                     f"{row['nfe_mean']:>8.2f}" + (f" {row['cost_mean']:>8.2f}" if cost else ""))
    return "\n".join(lines)


def summary_table(rows: Iterable[Mapping[str, Any]], reference_accuracy: float | None = None,
                  keep: float = 0.98, x_name: str = "NFE") -> str:
    """Markdown table, one line per family (with its preset where that is more than the rule's plain option):
    runs, front points, best accuracy, NFE range, AUP (`aup.py`: area under accuracy vs tokens per forward; —
    where rows do not record tokens per step), the lowest NFE run keeping >= `keep` of `reference_accuracy`
    (default: best accuracy of all real sampler runs) with its settings, and the settings the family was run with
    ("gamma ∈ {0.01, 0.1}; block_length=32"). `x_name` names what the rows' nfe_mean holds (cost, for pages drawn
    against the full cost)."""
    rows = list(rows)
    if reference_accuracy is None:
        reference_accuracy = reference_accuracy_of(rows)
    aups = family_aup(rows, derive_family)
    header = ["family", "runs", "front points", "best accuracy", f"{x_name} range", "AUP",
              f"lowest {x_name} with acc ≥ {keep:.0%} of {_fmt(reference_accuracy)}", "settings run"]
    lines = []
    for name, front in fronts_by_family(rows).items():
        own = [r for r in rows if derive_family(r) == name]
        everything = points(own)
        if not everything:
            continue
        nfes = [p.nfe for p in everything]
        kept = lowest_nfe_keeping(front, reference_accuracy, keep) if reference_accuracy is not None else None
        kept_text = "—" if kept is None else (
            f"{kept.nfe:.1f} (acc {kept.accuracy:.4f}; {sampler_settings(kept.payload.get('sampler'))})"
            if isinstance(kept.payload, Mapping) else f"{kept.nfe:.1f} (acc {kept.accuracy:.4f})")
        lines.append([_shown(name), len(everything), len(front), f"{max(p.accuracy for p in everything):.4f}",
                      f"{min(nfes):.1f}–{max(nfes):.1f}", _fmt(aups.get(name), ".1f"), kept_text,
                      family_settings(own)])
    return markdown_table(header, lines, align="lrrrrrll")


def speedup_table(rows: Iterable[Mapping[str, Any]], baseline_family: str,
                  accuracies: Sequence[float], x_name: str = "NFE") -> str:
    """Markdown table of each family's speedup over `baseline_family` at each target accuracy, as
    "4.00× (10.0 vs 40.0)" (interpolated NFE of the family vs of the baseline); "—" where either misses it."""
    fronts = fronts_by_family(rows)
    baseline = fronts.get(baseline_family, [])
    baseline_nfe = [_fmt(nfe_at_accuracy(baseline, a), ".1f") for a in accuracies]
    lines = [[f"{baseline_family} {x_name} (baseline)", *baseline_nfe]]
    for name, front in fronts.items():
        if name == baseline_family:
            continue
        cells = []
        for a, theirs in zip(accuracies, baseline_nfe):
            ratio = speedup(front, baseline, a)
            cells.append("—" if ratio is None else
                         f"{ratio:.2f}× ({_fmt(nfe_at_accuracy(front, a), '.1f')} vs {theirs})")
        lines.append([_shown(name), *cells])
    header = ["family", *(f"acc {a:.4f}" for a in accuracies)]
    return markdown_table(header, lines, align="l" + "r" * len(accuracies))

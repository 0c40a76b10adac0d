"""Accuracy-vs-NFE Pareto fronts of sampler results: load, de-duplicate, compare.

A point is one row of `evaluate.py`'s JSONL (`mdmkit.io.results`): (`nfe_mean`, `accuracy`) and the row as payload.
Rows are grouped by the family `mdmkit.io.naming` gives them; rows of kind "oracle" (a reference run's NFE floor)
form the family "oracle", a reference curve that never enters the overall front of real samplers. A front is sorted
by NFE, with strictly increasing accuracy. Figures and tables are `pareto_plot` and `pareto_tables`: this module
imports neither matplotlib nor torch, so reading results is cheap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from mdmkit.io.naming import ORACLE, derive_family, sampler_family
from mdmkit.io.results import canonical, read_records

DEFAULT_KINDS: tuple[str, ...] = ("evaluate", ORACLE)


class Point(NamedTuple):
    """One (NFE, accuracy) measurement; `payload` is usually the results row it came from."""

    nfe: float
    accuracy: float
    payload: Any = None


PointLike = Point | tuple[float, float] | tuple[float, float, Any]


# ---------------------------------------------------------------------------------------------- loading rows


def _checkpoint_id(row: Mapping[str, Any]) -> str:
    return str(row.get("checkpoint_sha") or row.get("checkpoint") or "")


def _seed(row: Mapping[str, Any]) -> Any:
    if "seed" in row:
        return row["seed"]
    config = row.get("config")
    return config.get("seed") if isinstance(config, Mapping) else None


def test_set_differences(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """How the rows' test sets differ, if they do: in their examples (`test_set`, a hash of them; rows without it
    compare by size alone) or in how many they hold (`limit`)."""
    rows = list(rows)
    sizes = sorted({str(row.get("n")) for row in rows})
    examples = {row["test_set"] for row in rows if "test_set" in row}
    return ([f"n = {', '.join(sizes)}"] if len(sizes) > 1 else []) + (
        [f"{len(examples)} different sets of examples (task settings or test_file)"] if len(examples) > 1 else [])


def dedup_key(row: Mapping[str, Any]) -> tuple:
    """Identity of an evaluation: the row's `key` if it has one, else (kind, checkpoint, task, family, sampler
    config, seed, n). `n` is part of it so that a quick `limit=` run never replaces a full-split run."""
    if row.get("key") is not None:
        return ("key", canonical(row["key"]))
    return (row.get("kind"), _checkpoint_id(row), row.get("task"), derive_family(row),
            canonical(row.get("sampler")), canonical(_seed(row)), row.get("n"))


def _jsonl_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        elif path.is_file():
            found = [path]
        else:
            raise FileNotFoundError(f"no such results file or directory: {path}")
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                files.append(file)
    return files


def load_rows(paths: Iterable[str | Path], kinds: Sequence[str] | None = DEFAULT_KINDS) -> list[dict[str, Any]]:
    """Merge rows from JSONL files and directories (every `*.jsonl` below, recursively), keep `kinds` (None:
    all), fill a missing `family` (from the sampler config), and de-duplicate by `dedup_key`, keeping the latest
    by `time` (on equal times, the one read last). Files are read in the order given, directories in sorted
    path order."""
    kept: dict[tuple, dict[str, Any]] = {}
    for file in _jsonl_files(paths):
        for row in read_records(file):
            if kinds is not None and row.get("kind") not in kinds:
                continue
            row = {**row, "family": row.get("family") or sampler_family(row.get("sampler"), row.get("kind"))}
            key = dedup_key(row)
            old = kept.get(key)
            if old is None or str(row.get("time", "")) >= str(old.get("time", "")):
                kept.pop(key, None)  # re-insert: the order of `kept` follows the winning rows
                kept[key] = row
    return list(kept.values())


def _matches_checkpoint(row: Mapping[str, Any], checkpoint: str) -> bool:
    sha, path = str(row.get("checkpoint_sha") or ""), str(row.get("checkpoint") or "")
    if checkpoint in (sha, path):
        return True
    if sha and len(checkpoint) >= 7 and sha.startswith(checkpoint):
        return True
    return bool(path) and (Path(path).name == checkpoint or Path(path).expanduser().resolve()
                           == Path(checkpoint).expanduser().resolve())


def select_rows(rows: Iterable[Mapping[str, Any]], task: str | None = None,
                checkpoint: str | None = None) -> list[dict[str, Any]]:
    """Rows of one task and/or checkpoint (its sha, a sha prefix of >= 7 characters, its path or file name)."""
    return [dict(row) for row in rows
            if (task is None or row.get("task") == task)
            and (checkpoint is None or _matches_checkpoint(row, checkpoint))]


def checkpoints(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Distinct checkpoint ids (sha, else path) of the rows, sorted."""
    return sorted({_checkpoint_id(row) for row in rows})


def sort_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows in a stable order for writing: kind, family, NFE, accuracy, sampler config, time."""
    def key(row: Mapping[str, Any]) -> tuple:
        return (str(row.get("kind")), str(row.get("family")), _number(row.get("nfe_mean")),
                _number(row.get("accuracy")), canonical(row.get("sampler")), str(row.get("time", "")))
    return [dict(row) for row in sorted(rows, key=key)]


# ------------------------------------------------------------------------------------------------- fronts


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def points(rows: Iterable[Mapping[str, Any]]) -> list[Point]:
    """Points (nfe_mean, accuracy, row) of the rows that have both as finite numbers."""
    out = []
    for row in rows:
        nfe, accuracy = _number(row.get("nfe_mean")), _number(row.get("accuracy"))
        if math.isfinite(nfe) and math.isfinite(accuracy):
            out.append(Point(nfe, accuracy, row))
    return out


def pareto_front(candidates: Iterable[PointLike]) -> list[Point]:
    """The non-dominated points, sorted by NFE. A point is dominated when another has NFE <= and accuracy >=,
    one of them strictly. Of identical (NFE, accuracy) points the first given is kept. Accepts `Point`s or
    (nfe, accuracy[, payload]) tuples."""
    pts = [p if isinstance(p, Point) else Point(*p) for p in candidates]
    order = sorted(range(len(pts)), key=lambda i: (pts[i].nfe, -pts[i].accuracy, i))
    front: list[Point] = []
    for i in order:
        if not front or pts[i].accuracy > front[-1].accuracy:
            front.append(pts[i])
    return front


def on_axes(rows: Iterable[Mapping[str, Any]], metric: str = "accuracy", cost: bool = False) -> list[dict[str, Any]]:
    """Rows as the front code reads them: `metric` as accuracy (its CI only belongs to accuracy itself; rows
    without the metric go) and, with `cost`, the full cost (NFE + fractional passes) as NFE."""
    out = []
    for row in recorded_with(rows, metric):
        row = dict(row)
        if cost:
            row["nfe_mean"] = row.get("cost_mean", row["nfe_mean"])
        if metric != "accuracy":
            row.update(accuracy=row[metric], accuracy_ci95=None)
        out.append(row)
    return out


def recorded_with(rows: Iterable[Mapping[str, Any]], metric: str) -> list[Mapping[str, Any]]:
    """The rows that record `metric` (every row records accuracy), as recorded."""
    return [row for row in rows if metric == "accuracy" or isinstance(row.get(metric), (int, float))]


def families(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Families present, sorted, with "oracle" last."""
    names = {derive_family(row) for row in rows}
    return sorted(names - {ORACLE}) + ([ORACLE] if ORACLE in names else [])


def fronts_by_family(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Point]]:
    """Each family's front (oracle rows under "oracle", last), payloads being the rows."""
    rows = list(rows)
    return {name: pareto_front(points(r for r in rows if derive_family(r) == name)) for name in families(rows)}


def overall_front(rows: Iterable[Mapping[str, Any]]) -> list[Point]:
    """The front of all real sampler runs: oracle rows are left out."""
    return pareto_front(points(r for r in rows if derive_family(r) != ORACLE and r.get("kind") != ORACLE))


# --------------------------------------------------------------------------------------- reading a front


def interpolate_accuracy(front: Sequence[PointLike], nfe: float) -> float | None:
    """Accuracy of the front at `nfe`, piecewise-linear between front points; None outside [min NFE, max NFE]
    of the front, or for an empty front (no extrapolation, no clamping). Raw points are reduced to their front."""
    pts = pareto_front(front)  # sorted by NFE, NFE and accuracy strictly increasing
    if not pts or nfe < pts[0].nfe or nfe > pts[-1].nfe:
        return None
    for left, right in itertools.pairwise(pts):
        if nfe <= right.nfe:
            return left.accuracy + (nfe - left.nfe) / (right.nfe - left.nfe) * (right.accuracy - left.accuracy)
    return pts[-1].accuracy  # a single point, nfe equal to it


def nfe_at_accuracy(front: Sequence[PointLike], accuracy: float) -> float | None:
    """Smallest NFE at which the front reaches `accuracy`: the front's first NFE when its first point already
    does, linear interpolation between the two front points around it otherwise; None if never reached."""
    pts = pareto_front(front)  # sorted by NFE, accuracy strictly increasing
    if not pts or accuracy > pts[-1].accuracy:
        return None
    if accuracy <= pts[0].accuracy:
        return pts[0].nfe
    for left, right in itertools.pairwise(pts):
        if accuracy <= right.accuracy:
            fraction = (accuracy - left.accuracy) / (right.accuracy - left.accuracy)
            return left.nfe + fraction * (right.nfe - left.nfe)
    return None  # unreachable: accuracy <= pts[-1].accuracy


def speedup(front: Sequence[PointLike], baseline_front: Sequence[PointLike], accuracy: float) -> float | None:
    """NFE the baseline needs for `accuracy` divided by the NFE the front needs (both interpolated); None when
    either never reaches it."""
    ours, theirs = nfe_at_accuracy(front, accuracy), nfe_at_accuracy(baseline_front, accuracy)
    if ours is None or theirs is None or ours <= 0:
        return None
    return theirs / ours


def lowest_nfe_keeping(front: Sequence[PointLike], reference_accuracy: float, keep: float = 0.98) -> Point | None:
    """The measured point of lowest NFE with accuracy >= keep * reference_accuracy (a real run, not an
    interpolation, so it names a configuration one can use); None if there is none."""
    return next((p for p in pareto_front(front) if p.accuracy >= keep * reference_accuracy), None)


def lowest_nfe_keeping_by_family(rows: Iterable[Mapping[str, Any]], reference_accuracy: float,
                                 keep: float = 0.98) -> dict[str, Point | None]:
    """`lowest_nfe_keeping` for every family (oracle included, last)."""
    return {name: lowest_nfe_keeping(front, reference_accuracy, keep)
            for name, front in fronts_by_family(rows).items()}


def reference_accuracy_of(rows: Iterable[Mapping[str, Any]], family: str | None = None) -> float | None:
    """Default reference accuracy: the best accuracy of `family` (e.g. the full-step top-k baseline), or of all
    real sampler runs when `family` is None; None without such rows."""
    chosen = (r for r in rows if (derive_family(r) == family if family else derive_family(r) != ORACLE))
    accuracies = [p.accuracy for p in points(chosen)]
    return max(accuracies) if accuracies else None

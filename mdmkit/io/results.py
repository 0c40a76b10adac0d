"""Results rows: one JSON object per line, appended atomically and never overwritten.

A row carries what is needed to trust and re-find it later: the checkpoint's content fingerprint, the git
commit and package versions, the machine, and a `key` over everything that determines the measurement
(checkpoint, task data, sampler, seed, limit), so a re-run sweep can skip what is already done.

It also names rows, the same way in console lines, tables and plots (`sampler_family`, `preset_family`,
`sampler_settings`). The row's `preset` (the `conf/sampler` option) is a name beside the config, never in `key`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from mdmkit.core.config import identity
from mdmkit.core.errors import ConfigError


def machine() -> str:
    import torch  # here, so that reading results (Pareto fronts, plots) never pays for importing torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    processor = platform.processor() or platform.machine()
    return f"{processor}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} threads"


def canonical(value: Any) -> str:
    """Compact JSON with sorted keys: equal values give equal strings, for keys, hashes and de-duplication."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def row_key(**parts: Any) -> str:
    """A stable id for a measurement: the hash of what determines it."""
    return hashlib.sha256(canonical(parts).encode()).hexdigest()[:20]


def evaluation_key(kind: str, sampler: Mapping[str, Any], measurement: Mapping[str, Any]) -> str:
    """The key of an evaluation row: its kind, the sampler's `identity` and what it was measured on (model, data,
    seed, limit, batch size), all stored in the row, so a row can always be keyed again from itself."""
    return row_key(kind=kind, sampler=identity(dict(sampler)), **measurement)


@cache
def file_fingerprint(path: str) -> str:
    """Content hash of a checkpoint (so renamed copies are recognised, retrained files are not confused)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@cache
def provenance() -> dict[str, Any]:
    """Git commit (with a dirty flag) and the versions of the packages that shape a result."""
    root = Path(__file__).resolve().parents[2]
    commit = None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=False, timeout=10)
        if head.returncode == 0:
            commit = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    versions = {"python": sys.version.split()[0]}
    for package in ("mdmkit", "torch", "lightning", "hydra-core", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"git_commit": commit, "versions": versions}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0% and 100%, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test of two models on the same examples: the chance, were both equally good, that
    the examples one solves and the other fails split at least this unevenly (ties, solved or failed by both,
    carry no information and are left out)."""
    changed = gained + lost
    tail = sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2 ** changed
    return min(1.0, 2 * tail)


def append_record(path: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one row as a single write + fsync: a crash leaves whole rows, at worst one torn last line.

    Returns the row as stored (stamped with time and machine).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **record}
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # never glue a row onto a torn last line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All whole rows of a results file; a torn line (from a killed writer) is skipped with a warning."""
    path = Path(path).expanduser()
    if not path.exists():
        return []
    rows = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:  # a torn line from a killed writer, or one that is not a row at all
                warnings.warn(f"{path}:{number}: skipping a torn results line", stacklevel=2)
    return rows


def check_writable(path: str | Path) -> None:
    """Stop before any work if rows could not be appended to `path` (they would be lost after the work)."""
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        if not existed:
            path.unlink(missing_ok=True)  # no empty file left by a run that fails later (ranks race here)
    except OSError as error:
        raise ConfigError(f"results_file={path} cannot be written: {error.strerror or error}") from None


# ---------------------------------------------------------------------------------------- names and labels

ORACLE = "oracle"
# Fields the family name already says (ordering and P2's score, the KV cache) or that name the class.
_IN_FAMILY = ("_target_", "name", "ordering", "score", "cache")


@cache
def _masked_loop_defaults() -> dict[str, Any]:
    """The fields every masked-loop sampler shares, at the values that change nothing: left out of labels (a
    temperature of 0.7 is shown, one of 0.0 is not)."""
    from mdmkit.samplers import MaskedSampler

    return {field.name: field.default for field in dataclasses.fields(MaskedSampler)}


def sampler_family(sampler: Mapping[str, Any] | None, kind: str | None = None) -> str:
    """The sampling rule of a sampler config: the class name without "Sampler"/"Decoder", lower case, then the
    ordering (P2: its score) and a KV cache other than none.

    `{"_target_": "mdmkit.samplers.EBSampler", "ordering": "entropy"}` -> "eb-entropy"; an NI sampler over EB ->
    "ni-eb-confidence"; EB with the dual cache -> "eb-confidence+dual"; an oracle floor ("oracle" kind or sampler
    name) -> "oracle".
    """
    sampler = sampler or {}
    if kind == ORACLE or sampler.get("name") == ORACLE:
        return ORACLE
    target = sampler.get("_target_")
    if target:
        name = str(target).rsplit(".", 1)[-1].removesuffix("Sampler").removesuffix("Decoder").lower()
    else:
        name = str(sampler.get("name", "unknown")).lower()
    for inner in ("rule", "base"):  # a decoder that delegates reveals to a sampler (SBD), a sampler on another (NI)
        if isinstance(sampler.get(inner), Mapping):
            return f"{name}-{sampler_family(sampler[inner])}"
    ordering = sampler.get("ordering", sampler.get("score"))
    family = f"{name}-{ordering}" if isinstance(ordering, str) and ordering else name
    cache = sampler.get("cache")
    return f"{family}+{cache}" if isinstance(cache, str) and cache not in ("", "none") else family


def _normalised(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def is_plain_preset(preset: str, family: str) -> bool:
    """Whether the option `preset` is the rule's own option, which the family name already says: "eb" for
    "eb-confidence", "ni_eb" for "ni-eb-confidence", "dream_steps" for "dreamsteps-entropy", "all" for
    "revealall-confidence"; not "llada" (a steps schedule), "fastdllm_threshold" or "dream_entropy"."""
    name = _normalised(preset)
    parts = family.split("+")[0].split("-")
    prefixes = {_normalised("".join(parts[:i])) for i in range(1, len(parts) + 1)}
    return name in prefixes or (len(name) >= 3 and _normalised(parts[0]).endswith(name))


def preset_family(family: str, preset: str | None) -> str:
    """The family a row is drawn and tabled under: `family` itself for rows without a preset (a config composed
    outside Hydra) and for the rule's plain option; else the option first: ("steps-confidence", "llada") ->
    "llada (steps-confidence)", so presets with different configs get fronts of their own. Idempotent."""
    if not preset or family == ORACLE or is_plain_preset(preset, family) or f"{preset} (" in family:
        return family
    return f"{preset} ({family})"


def settings_items(sampler: Mapping[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    """The (field, value) pairs of a sampler config that tell runs of one family apart: fields the family name
    says and shared fields at their no-op value are left out; a nested sampler (NI's base, SBD's rule) gives
    "base.k"-style fields; an oracle floor gives those of the sampler it is the floor of."""
    if not sampler:
        return []
    if sampler.get("name") == ORACLE:
        return settings_items(sampler.get("reference") or {}, prefix)
    items: list[tuple[str, Any]] = []
    shared = _masked_loop_defaults()
    for key, value in sampler.items():
        if key in _IN_FAMILY or value is None or (key in shared and value == shared[key]):
            continue
        if isinstance(value, Mapping):
            items += settings_items(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def sampler_settings(sampler: Mapping[str, Any] | None) -> str:
    """`settings_items` as "key=value, ...": "gamma=0.001", "epsilon=0.9, base.k=1". An oracle floor:
    "floor of <family> <settings>"."""
    if sampler and sampler.get("name") == ORACLE:
        inner = sampler.get("reference") or {}
        return f"floor of {sampler_family(inner)} {sampler_settings(inner)}".strip()
    return ", ".join(f"{key}={value}" for key, value in settings_items(sampler))


def run_label(family: str, sampler: Mapping[str, Any] | None, preset: str | None = None) -> str:
    """How one run is named on a console line or in a plot: "eb-confidence gamma=0.001", "llada (steps-confidence)
    steps=64, block_length=32"; an oracle floor: "oracle floor of topk-confidence k=1"."""
    sampler = sampler or {}
    if family == ORACLE or sampler.get("name") == ORACLE:
        inner = sampler.get("reference") or {}
        return f"oracle floor of {run_label(sampler_family(inner), inner, preset)}".strip()
    return f"{preset_family(family, preset)} {sampler_settings(sampler)}".strip()

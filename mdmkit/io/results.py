"""Results rows: one JSON object per line, appended atomically and never overwritten.

A row carries what is needed to trust and re-find it later: the checkpoint's content fingerprint, the git
commit and package versions, the machine, and a `key` over everything that determines the measurement
(checkpoint, task data, sampler, seed, limit), so a re-run sweep can skip what is already done. The row's
`preset` (the `conf/sampler` option) and `family` (`mdmkit.io.naming`) are names beside the config, never in `key`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
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

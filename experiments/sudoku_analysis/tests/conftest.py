"""The study's tests: run from the repository root (pyproject.toml's pytest settings put it on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 1500  # a guard against hangs, never a speed check


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated puzzles cached for this session alone."""
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "data-cache"))


def run_module(*args: str, cache_dir: Path) -> subprocess.CompletedProcess:
    """`python -m experiments.sudoku_analysis.sudoku_errors args...` as a user would run it, from the checkout."""
    return subprocess.run([sys.executable, "-m", "experiments.sudoku_analysis.sudoku_errors", *args], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=WAIT_S,
                          env={**os.environ, "MDMKIT_CACHE_DIR": str(cache_dir)})

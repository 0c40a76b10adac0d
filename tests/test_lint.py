"""The checkout passes ruff with the project's settings (pyproject.toml pins the ruff release: its defaults move)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WAIT_S

RUFF = Path(sys.executable).with_name("ruff")


def _ruff(*paths: Path) -> subprocess.CompletedProcess:
    if not RUFF.exists():
        pytest.skip(f"ruff is not installed beside {sys.executable} (the dev extra: pip install -e '.[dev]')")
    command = [str(RUFF), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *map(str, paths)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=WAIT_S)


def test_the_checkout_is_ruff_clean() -> None:
    result = _ruff(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr


def test_ruff_fails_on_a_module_with_an_unused_import(tmp_path: Path) -> None:
    module = tmp_path / "errors.py"
    module.write_text("import os\n" + (ROOT / "mdmkit/core/errors.py").read_text())
    result = _ruff(module)
    assert result.returncode == 1 and "F401" in result.stdout


def test_ruff_fails_on_a_line_over_the_length(tmp_path: Path) -> None:
    module = tmp_path / "long.py"
    module.write_text(f'"""A module."""\n\nNAME = "{"x" * 120}"\n')
    result = _ruff(module)
    assert result.returncode == 1 and "E501" in result.stdout

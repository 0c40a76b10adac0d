"""The package type-checks: mypy, with pyproject.toml's [tool.mypy] settings, finds no error in `mdmkit/`.

mypy keeps its cache in the checkout's .mypy_cache (a cold check is mostly torch's stubs; transformers is skipped:
see pyproject.toml). To show that the check can fail, one test runs it on a small module with the errors the settings
are there to catch.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WAIT_S


def _mypy(*paths: Path) -> subprocess.CompletedProcess:
    """mypy with the project's settings, on `paths` (default: its `files`, the package)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip(f"mypy is not installed beside {sys.executable} (the dev extra: pip install -e '.[dev]')")
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary", "--hide-error-context", *map(str, paths)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=WAIT_S)


def test_the_package_type_checks() -> None:
    result = _mypy()
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]


def test_mypy_fails_on_an_unannotated_function_and_an_unchecked_optional(tmp_path: Path) -> None:
    module = tmp_path / "loose.py"
    module.write_text("import re\n\n\ndef untyped(x):\n    return x\n\n\n"
                      "def first_word(text: str) -> str:\n    return re.match(r'\\w+', text).group(0)\n")
    result = _mypy(module)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[no-untyped-def]" in result.stdout and "[union-attr]" in result.stdout, result.stdout

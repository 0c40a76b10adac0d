"""tools/device/device_env.sh: a device call whose image lacks a module stops in one line before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_env.sh"


def source(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": python}
    return subprocess.run(["bash", "-c", f"source {SCRIPT} && echo sourced"], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def test_a_complete_environment_sources_cleanly(tmp_path: Path) -> None:
    done = source(tmp_path, sys.executable)
    assert done.returncode == 0 and "sourced" in done.stdout, done.stderr[-2000:]


def test_a_module_broken_at_import_is_named_with_the_fix(tmp_path: Path) -> None:
    """As on the device image of 2026-11-26: `datasets` absent, or a huggingface_hub too new for transformers."""
    fake = tmp_path / "fake" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("huggingface-hub>=1.5.0,<2.0 is required")\n')
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = source(tmp_path, str(python))
    assert done.returncode == 1 and "sourced" not in done.stdout
    expected = ("device_env.sh: cannot import datasets (ImportError: huggingface-hub>=1.5.0,<2.0 is required): "
                "run tools/device/device_wheels.sh here and carry .whl")
    assert done.stderr.strip().splitlines() == [expected]

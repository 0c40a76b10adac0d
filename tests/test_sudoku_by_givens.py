"""scripts/sudoku_by_givens.py: per-givens counts that add up to the evaluation's accuracy, and its page."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "sudoku_by_givens.py"
SUDOKU_CKPT = str(ROOT / "checkpoints" / "sudoku_mdm.pt")  # the CPU model: 30-36 givens


def load_script():
    spec = importlib.util.spec_from_file_location("sudoku_by_givens", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_add_up_to_the_evaluations_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))
    result = load_script().by_givens(SUDOKU_CKPT, "confidence", limit=30, batch_size=16)
    rows = result["by_givens"]
    assert sum(r["n"] for r in rows.values()) == result["n"] == 30
    assert sum(r["correct"] for r in rows.values()) / 30 == pytest.approx(result["accuracy"])
    assert set(rows) <= set(range(30, 37))  # the model's task: 30-36 givens
    for r in rows.values():
        assert r["ci95"][0] - 1e-9 <= r["accuracy"] <= r["ci95"][1] + 1e-9


def test_a_maze_checkpoint_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="is a maze model"):
        load_script().by_givens(str(ROOT / "checkpoints" / "maze_mdm.pt"), "confidence", 2, batch_size=2)


def test_the_page_is_written(tmp_path: Path) -> None:
    out = tmp_path / "page"
    command = [sys.executable, str(SCRIPT), SUDOKU_CKPT, "--limit", "8", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MDMKIT_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "page.json").read_text())
    assert data["models"][0]["n"] == 8 and (tmp_path / "page.png").stat().st_size > 0
    page = (tmp_path / "page.md").read_text()
    assert "![accuracy by givens](page.png)" in page and f"{100 * data['models'][0]['accuracy']:.1f}%" in page

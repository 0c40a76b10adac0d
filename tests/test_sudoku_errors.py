"""scripts/sudoku_errors.py: counts by givens and by logic that add up to the evaluation's accuracy, failures
traced to their first wrong grid, and its page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, load_script, run_script

from mdmkit.io.checkpoint import TrainedModel
from mdmkit.tasks.sudoku_logic import GRADES, HIDDEN, NAKED

SUDOKU_CKPT = str(ROOT / "checkpoints" / "sudoku_mdm.pt")  # the CPU model: 30-36 givens


def test_counts_add_up_to_the_evaluations_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))
    result = load_script("sudoku_errors").count_errors(SUDOKU_CKPT, "confidence", limit=40, batch_size=16)
    assert result["n"] == 40
    for field in ("by_givens", "by_logic", "by_left_by_singles"):
        rows = result[field]
        assert sum(r["n"] for r in rows.values()) == 40
        assert sum(r["correct"] for r in rows.values()) / 40 == pytest.approx(result["accuracy"])
        for r in rows.values():
            assert r["ci95"][0] - 1e-9 <= r["accuracy"] <= r["ci95"][1] + 1e-9
    assert set(result["by_givens"]) <= set(range(30, 37))  # the model's task: 30-36 givens
    assert list(result["by_logic"]) == [g for g in GRADES if g in result["by_logic"]]
    assert result["by_left_by_singles"]["0"]["n"] == sum(result["by_logic"].get(g, {"n": 0})["n"]
                                                         for g in (NAKED, HIDDEN))


def test_failures_are_traced_to_their_first_wrong_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))
    result = load_script("sudoku_errors").count_errors(SUDOKU_CKPT, "confidence", limit=60, batch_size=32)
    assert result["failures"] == round(60 * (1 - result["accuracy"])) > 0  # the CPU model fails ~7%
    found = result["first_wrong"]
    assert 0 < len(found) <= result["failures"]
    test = TrainedModel(SUDOKU_CKPT).task.load_test().head(60)
    for first in found:
        blanks = int(test.answer_mask[first["puzzle"]].sum())
        assert first["blanks"] == blanks - first["step"]  # Top-1 fills one cell a step, all right until here
        assert 0 <= first["left_by_singles"] <= first["blanks"] and first["entropy"] >= 0


def test_a_maze_checkpoint_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="is a maze model"):
        load_script("sudoku_errors").count_errors(str(ROOT / "checkpoints" / "maze_mdm.pt"), "confidence", 2,
                                                  batch_size=2)


def test_the_page_is_written(tmp_path: Path) -> None:
    out = tmp_path / "page"
    done = run_script("sudoku_errors", SUDOKU_CKPT, "--limit", "8", "--out", str(out), cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "page.json").read_text())
    assert data["models"][0]["n"] == 8 and (tmp_path / "page.png").stat().st_size > 0
    page = (tmp_path / "page.md").read_text()
    assert "![accuracy by givens and by cells left after singles](page.png)" in page
    assert "## By the logic a puzzle needs" in page and "## The grid each failure first went wrong on" in page
    assert f"{100 * data['models'][0]['accuracy']:.1f}%" in page

"""sudoku_errors: counts by givens and by logic that add up to the evaluation's accuracy, failures traced to
their first wrong grid, and its page."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from experiments.sudoku_analysis import sudoku_errors
from experiments.sudoku_analysis.sudoku_logic import GRADES, HIDDEN, NAKED, grade_puzzle
from experiments.sudoku_analysis.tests.conftest import ROOT, run_module
from mdmkit.analysis.stats import sign_test
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.tasks.sudoku import puzzles_and_solutions

SUDOKU_CKPT = str(ROOT / "checkpoints" / "sudoku_mdm.pt")  # the CPU model: 30-36 givens


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The counts of the first 60 test puzzles, made once for the tests that read them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MDMKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return sudoku_errors.count_errors(SUDOKU_CKPT, "confidence", limit=60, batch_size=32)


def test_counts_add_up_to_the_evaluations_accuracy(counted: dict) -> None:
    result = counted
    assert result["n"] == 60
    for field in ("by_givens", "by_logic", "by_left_by_singles"):
        rows = result[field]
        assert sum(r["n"] for r in rows.values()) == 60
        assert sum(r["correct"] for r in rows.values()) / 60 == pytest.approx(result["accuracy"])
        for r in rows.values():
            assert r["ci95"][0] - 1e-9 <= r["accuracy"] <= r["ci95"][1] + 1e-9
    assert set(result["by_givens"]) <= set(range(30, 37))  # the model's task: 30-36 givens
    assert list(result["by_logic"]) == [g for g in GRADES if g in result["by_logic"]]
    assert result["by_left_by_singles"]["0"]["n"] == sum(result["by_logic"].get(g, {"n": 0})["n"]
                                                         for g in (NAKED, HIDDEN))


def test_failures_are_traced_to_their_first_wrong_grid(counted: dict) -> None:
    result = counted
    assert result["failures"] == round(60 * (1 - result["accuracy"])) > 0  # the CPU model fails ~7%
    found = result["first_wrong"]
    assert 0 < len(found) <= result["failures"]
    test = TrainedModel(SUDOKU_CKPT).task.load_test().head(60)
    for first in found:
        blanks = int(test.answer_mask[first["puzzle"]].sum())
        assert first["blanks"] == blanks - first["step"]  # Top-1 fills one cell a step, all right until here
        assert 0 <= first["left_by_singles"] <= first["blanks"] and first["entropy"] >= 0
        puzzle = puzzles_and_solutions(test.tokens[first["puzzle"]][None].numpy(),
                                       test.answer_mask[first["puzzle"]][None].numpy())[0][0]
        assert first["puzzle_left_by_singles"] == grade_puzzle(puzzle).left_by_singles  # its own closure's blanks
        if first["left_by_singles"] == first["blanks"]:  # stuck: singles alone cannot have got below the closure
            assert first["blanks"] <= first["puzzle_left_by_singles"]


def test_a_maze_checkpoint_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="is a maze model"):
        sudoku_errors.count_errors(str(ROOT / "checkpoints" / "maze_mdm.pt"), "confidence", 2,
                                                  batch_size=2)


def test_the_page_is_written(tmp_path: Path) -> None:
    out = tmp_path / "page"
    done = run_module(SUDOKU_CKPT, "--limit", "8", "--out", str(out), cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "page.json").read_text())
    assert data["models"][0]["n"] == 8 and (tmp_path / "page.png").stat().st_size > 0
    page = (tmp_path / "page.md").read_text()
    assert "![accuracy by givens and by cells left after singles](page.png)" in page
    assert "## By the logic a puzzle needs" in page and "## The grid each failure first went wrong on" in page
    assert f"{100 * data['models'][0]['accuracy']:.1f}%" in page
    assert "## Puzzle by puzzle" not in page  # one checkpoint: nothing to compare


def test_one_checkpoint_twice_is_compared_puzzle_by_puzzle_with_nothing_changed(tmp_path: Path) -> None:
    out = tmp_path / "page"
    done = run_module(SUDOKU_CKPT, SUDOKU_CKPT, "--limit", "8", "--out", str(out),
                      cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = json.loads((tmp_path / "page.json").read_text())["models"]
    assert first["test_set"] == second["test_set"] and first["failed"] == second["failed"]
    row = f"| `sudoku_mdm.pt` | `sudoku_mdm.pt` | 0 | 0 | {len(first['failed'])} | 1 |"
    assert row in (tmp_path / "page.md").read_text()


def _model(name: str, failed: list[int], test_set: str = "split") -> dict:
    return {"checkpoint": name, "failed": failed, "test_set": test_set}


def test_puzzle_by_puzzle_counts_against_the_first_checkpoint_on_its_split() -> None:
    compare = sudoku_errors.puzzle_by_puzzle
    rows = compare([_model("old.pt", [1, 2, 3, 4]), _model("new.pt", [3, 4, 9]),
                    _model("other_task.pt", [], test_set="another split")])
    assert rows == [{"checkpoint": "new.pt", "against": "old.pt", "gained": 2, "lost": 1, "both_failed": 2,
                     "sign_test_p": pytest.approx(1.0)}]  # 2 against 1 of 3: as even as 3 can be


@pytest.mark.parametrize("gained, lost", [(0, 0), (1, 0), (5, 0), (3, 3), (4, 1), (2, 7), (9, 3)])
def test_the_sign_test_is_the_two_sided_binomial_tail_by_enumeration(gained: int, lost: int) -> None:
    changed = gained + lost
    # every way the changed puzzles could have split between the two models, each equally likely under the null
    splits = [sum(outcome) for outcome in itertools.product((0, 1), repeat=changed)]
    as_uneven = sum(abs(2 * g - changed) >= abs(gained - lost) for g in splits)
    assert sign_test(gained, lost) == pytest.approx(as_uneven / len(splits))
    assert sign_test(gained, lost) == sign_test(lost, gained)

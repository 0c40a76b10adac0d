"""scripts/sudoku_stuck_grids.py: the model's reading of a grid checked exactly on a fixed-logits toy, the
comparison on the CPU model's puzzles beyond singles, and its page."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_script
from fakes import FixedLogits

from mdmkit.io.checkpoint import TrainedModel
from mdmkit.tasks.sudoku import puzzles_and_solutions, serialize
from mdmkit.tasks.sudoku_generator import generate_puzzles
from mdmkit.tasks.sudoku_logic import stuck_grids

SUDOKU_CKPT = str(ROOT / "checkpoints" / "sudoku_mdm.pt")  # the CPU model: 30-36 givens
MASK = 10  # the Sudoku task's mask id: 9 digits, the end of line, then the mask


def test_reading_a_grid_is_exact_on_a_toy() -> None:
    puzzles, solutions = generate_puzzles(1, 30, seed=3)
    target = serialize(solutions)[0]
    wrong = target.copy()
    cells = np.flatnonzero(puzzles[0] == 0)
    wrong_cells = np.array([r * 10 + c for r, c in (divmod(int(i), 9) for i in cells[:5])])
    wrong[wrong_cells] = (wrong[wrong_cells] + 1) % 9  # five blanks predicted as another digit
    c = 0.9
    logits = torch.full((89, 11), math.log((1 - c) / 9))
    logits[torch.arange(89), torch.from_numpy(wrong)] = math.log(c)
    read = load_script("sudoku_stuck_grids")._read(FixedLogits(logits), puzzles, solutions, MASK, batch_size=1)
    assert read["grids"] == 1 and read["blanks_mean"] == len(cells)
    assert read["cell_accuracy"] == pytest.approx(1 - 5 / len(cells))
    assert read["entropy_mean"] == pytest.approx(-c * math.log(c) - (1 - c) * math.log((1 - c) / 9), abs=1e-5)
    assert read["surest_cell_accuracy"] in (0.0, 1.0)  # all cells equally sure: one of them, right or wrong


def test_closures_against_random_draws_on_the_cpu_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))
    result = load_script("sudoku_stuck_grids").compare(SUDOKU_CKPT, limit=60, seed=0, batch_size=16)
    assert result["n"] == 60 and 0 < result["beyond_singles"] < 60
    test = TrainedModel(SUDOKU_CKPT).task.load_test().head(60)
    paths = [stuck_grids(puzzle, solution)
             for puzzle, solution in zip(*puzzles_and_solutions(test.tokens.numpy(), test.answer_mask.numpy()))]
    later = [grid for path in paths for grid in path[1:]]
    assert result["past_a_guess"]["grids"] == len(later) > 0  # every puzzle with a path is beyond singles
    assert result["past_a_guess"]["blanks_mean"] == pytest.approx(np.mean([np.sum(g == 0) for g in later]))
    assert result["singles_closure"]["grids"] == result["random_draw"]["grids"] == result["beyond_singles"]
    own = result["own_path"]  # the CPU model's own path: checked against the sampler's in test_top1_stuck.py
    assert 0 < own["reveals_right"] <= own["grids"]
    for kind in ("singles_closure", "random_draw", "past_a_guess", "own_path"):
        read = result[kind]
        assert 0 <= read["cell_accuracy"] <= 1 and 0 <= read["surest_cell_accuracy"] <= 1
        assert read["entropy_mean"] >= 0
    assert 0 <= result["random_draw"]["stuck_share"] <= 1


def test_a_maze_checkpoint_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="is a maze model"):
        load_script("sudoku_stuck_grids").compare(str(ROOT / "checkpoints" / "maze_mdm.pt"), 2, 0, batch_size=2)


def test_the_page_is_written(tmp_path: Path) -> None:
    out = tmp_path / "page"
    done = run_script("sudoku_stuck_grids", SUDOKU_CKPT, "--limit", "40", "--out", str(out), cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "page.json").read_text())
    page = (tmp_path / "page.md").read_text()
    assert f"the {data['beyond_singles']} of its first 40 test puzzles" in page
    assert f"{100 * data['random_draw']['cell_accuracy']:.1f}%" in page
    assert f"| {data['past_a_guess']['grids']} | {data['past_a_guess']['blanks_mean']:.1f} |" in page
    assert f"its reveal there right: {data['own_path']['reveals_right']} of {data['own_path']['grids']})" in page

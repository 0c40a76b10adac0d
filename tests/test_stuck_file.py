"""More stuck rows from a file (data.stuck_file): a model's own stuck grids, harvested by
scripts/harvest_stuck_grids.py from training puzzles, joined to the task's stuck points, and refused in one line
where they are not this training split's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, compose_config, run_cli, run_script

from mdmkit.core.errors import ConfigError, DataFormatError
from mdmkit.tasks.sudoku import SudokuTask, puzzles_and_solutions
from mdmkit.tasks.sudoku_logic import singles_closure, stuck_grids
from mdmkit.training.datamodule import PuzzleDataModule
from mdmkit.training.preflight import check_run

SMALL = {"n_givens": [24, 30], "n_train": 300, "n_val": 40, "n_test": 40}  # TINY's split sizes


def _task(cache: Path, **settings) -> SudokuTask:
    return SudokuTask(**{**SMALL, "cache_dir": str(cache), **settings})


def _later_grids_file(task: SudokuTask, split: str, path: Path) -> np.ndarray:
    """Write the stuck grids past each first one of `split`'s puzzles as a stuck-rows file; return the grids."""
    rows = task.load_splits()[split]
    puzzles, solutions = puzzles_and_solutions(rows.tokens.numpy(), rows.answer_mask.numpy())
    found = [(grid, s) for p, s in zip(puzzles, solutions) for grid in stuck_grids(p, s)[1:]]
    assert found
    grids = np.array([grid for grid, _ in found])
    np.savez_compressed(path, **task.pack(task.examples(grids, np.array([s for _, s in found]))))
    return grids


def test_a_files_rows_follow_the_stuck_points_in_the_pool(tmp_path: Path) -> None:
    task = _task(tmp_path)
    grids = _later_grids_file(task, "train", tmp_path / "later.npz")
    train = task.load_splits()["train"]
    first = task.load_stuck_points(train)
    joined = task.load_stuck_points(train, "first", tmp_path / "later.npz")
    assert len(joined) == len(first) + len(grids)
    assert torch.equal(joined.tokens[:len(first)], first.tokens)
    assert np.array_equal(puzzles_and_solutions(joined.tokens[len(first):].numpy(),
                                                joined.answer_mask[len(first):].numpy())[0], grids)
    data = PuzzleDataModule(task, batch_size=8, eval_batch_size=8, val_examples=8, seed=0, stuck_fraction=0.25,
                            stuck_file=str(tmp_path / "later.npz"))
    data.prepare_data()
    assert torch.equal(data.stuck.tokens, joined.tokens)
    alone = task.load_stuck_points(train, "none", tmp_path / "later.npz")  # the file's rows, no task's
    assert torch.equal(alone.tokens, joined.tokens[len(first):])
    with pytest.raises(ConfigError, match="'none' keeps only a file's rows"):
        task.load_stuck_points(train, "none")


def test_rows_from_test_puzzles_or_another_split_are_refused(tmp_path: Path) -> None:
    task = _task(tmp_path)
    train = task.load_splits()["train"]
    _later_grids_file(task, "test", tmp_path / "test_rows.npz")
    with pytest.raises(ConfigError, match=r"rows are not from this task's training split"):
        task.load_stuck_points(train, "first", tmp_path / "test_rows.npz")
    _later_grids_file(task, "train", tmp_path / "train_rows.npz")
    other = _task(tmp_path, seed=1)
    with pytest.raises(ConfigError, match=r"rows are not from this task's training split"):
        other.load_stuck_points(other.load_splits()["train"], "first", tmp_path / "train_rows.npz")


def test_a_malformed_file_is_one_clear_error(tmp_path: Path) -> None:
    task = _task(tmp_path)
    train = task.load_splits()["train"]
    (tmp_path / "junk.npz").write_text("not a numpy archive")
    with pytest.raises(DataFormatError, match=r"junk.npz is not a sudoku stuck-rows file"):
        task.load_stuck_points(train, "first", tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", tokens_only=np.zeros(3))
    with pytest.raises(DataFormatError, match=r"other.npz is not a sudoku stuck-rows file"):
        task.load_stuck_points(train, "first", tmp_path / "other.npz")


def test_a_stuck_file_needs_stuck_rows_and_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.stuck_file adds stuck rows: set data.stuck_fraction > 0 too"):
        check_run(compose_config("train", [f"data.stuck_file={tmp_path}/x.npz"]))
    with pytest.raises(ConfigError, match=r"data.stuck_file not found: .*missing.npz"):
        check_run(compose_config("train", ["data.stuck_fraction=0.25", f"data.stuck_file={tmp_path}/missing.npz"]))
    with pytest.raises(ConfigError, match="data.stuck_grids=none keeps only data.stuck_file's rows: set it"):
        check_run(compose_config("train", ["data.stuck_fraction=0.25", "data.stuck_grids=none"]))


def test_harvested_from_the_cpu_model_and_trained_on(tmp_path: Path) -> None:
    slim = torch.load(ROOT / "checkpoints" / "sudoku_mdm.pt", weights_only=False)
    slim["config"]["task"].update(SMALL)  # the CPU model, reading the small split a tiny run trains on
    torch.save(slim, tmp_path / "model.pt")
    out = tmp_path / "harvest" / "own.npz"
    done = run_script("harvest_stuck_grids", str(tmp_path / "model.pt"), "--puzzles", "12", "--out", str(out),
                      "--device", "cpu", cache_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["beyond_singles"] == 12 and 0 < meta["reveals_right"] <= meta["grids"]
    train = _task(tmp_path).load_splits()["train"]
    rows = _task(tmp_path).load_stuck_points(train, "first", out)
    assert len(rows) == len(_task(tmp_path).load_stuck_points(train)) + meta["grids"]

    run = run_cli("train.py", *TINY, "task.n_givens=[24,30]", "data.stuck_fraction=0.25", f"data.stuck_file={out}",
                  "evaluate_after_training=false", f"task.cache_dir={tmp_path}", f"hydra.run.dir={tmp_path}/run",
                  cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"and from {out}" in run.stdout + run.stderr


def test_the_committed_models_own_stuck_grids_are_stuck_and_right() -> None:
    """checkpoints/sudoku_paper.stuck_grids.npz, the next device leg's data.stuck_file (harvested from the committed
    model): a sample of its grids are each one that singles cannot move and that agrees with its solution, and the
    JSON beside it counts its rows."""
    path = ROOT / "checkpoints" / "sudoku_paper.stuck_grids.npz"
    meta = json.loads(path.with_suffix(".json").read_text())
    with np.load(path) as arrays:
        rows = SudokuTask(**SMALL).unpack(dict(arrays))
    assert len(rows) == meta["grids"] > 0
    grids, solutions = puzzles_and_solutions(rows.tokens, rows.answer_mask)
    for index in np.random.default_rng(0).choice(len(rows), 300, replace=False):
        grid, solution = grids[index], solutions[index]
        assert (grid == 0).any() and np.array_equal(singles_closure(grid), grid)
        assert np.array_equal(grid[grid > 0], solution[grid > 0])

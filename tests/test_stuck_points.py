"""Training on stuck points (data.stuck_fraction): the grids where singles run out, mixed into each batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, compose_config, run_cli

from mdmkit.core.config import to_container
from mdmkit.core.errors import ConfigError
from mdmkit.tasks.sudoku import SudokuTask, puzzles_and_solutions
from mdmkit.tasks.sudoku_generator import find_solutions
from mdmkit.tasks.sudoku_logic import BEYOND, grade_puzzle, singles_closure, stuck_grids
from mdmkit.training.datamodule import PuzzleDataModule, StepIndexedBatches
from mdmkit.training.preflight import check_components, check_run


def _task(tmp_path: Path, **settings) -> SudokuTask:
    return SudokuTask(**{"n_givens": (24, 30), "n_train": 200, "n_val": 20, "n_test": 20,
                         "cache_dir": str(tmp_path), **settings})


def test_stuck_points_are_the_closures_of_exactly_the_puzzles_singles_cannot_finish(tmp_path: Path) -> None:
    task = _task(tmp_path)
    made = task.generate(120, seed=5)
    puzzles, solutions = puzzles_and_solutions(made.tokens, made.answer_mask)
    beyond = [i for i, puzzle in enumerate(puzzles) if grade_puzzle(puzzle).grade == BEYOND]
    stuck = task.stuck_points(made)
    stuck_puzzles, stuck_solutions = puzzles_and_solutions(stuck.tokens, stuck.answer_mask)

    assert 0 < len(beyond) < len(puzzles)  # the fixture holds both kinds
    assert len(stuck) == len(beyond)
    for i, puzzle, solution in zip(beyond, stuck_puzzles, stuck_solutions):
        assert np.array_equal(solution, solutions[i])  # the same answer
        given = puzzles[i] != 0
        assert np.array_equal(puzzle[given], puzzles[i][given])  # every original given kept ...
        assert (puzzle != 0).sum() > given.sum()  # ... and the cells singles decide added
        assert np.array_equal(singles_closure(puzzle), puzzle)  # no single is left to play
        assert len(find_solutions(puzzle.astype(np.int8), limit=2)) == 1  # still a puzzle with one answer


def test_stuck_grids_follow_a_solve_past_each_guess(tmp_path: Path) -> None:
    made = _task(tmp_path).generate(120, seed=5)
    puzzles, solutions = puzzles_and_solutions(made.tokens, made.answer_mask)
    paths = [stuck_grids(puzzle, solution) for puzzle, solution in zip(puzzles, solutions)]
    assert max(map(len, paths)) >= 2  # the fixture holds puzzles that get stuck again after a guess
    for puzzle, solution, path in zip(puzzles, solutions, paths):
        assert bool(path) == (grade_puzzle(puzzle).grade == BEYOND)  # none where singles solve it
        if not path:
            continue
        assert np.array_equal(path[0], singles_closure(puzzle))  # the first: where singles first run out
        (only,) = stuck_grids(puzzle, solution, most=1)
        assert np.array_equal(only, path[0])
        blanks = [int((grid == 0).sum()) for grid in path]
        assert blanks == sorted(blanks, reverse=True) and len(set(blanks)) == len(blanks)  # each past a guess
        for before, grid in itertools.pairwise(path):
            assert np.array_equal(grid[before != 0], before[before != 0])  # the solve only adds cells
        for grid in path:
            assert np.array_equal(singles_closure(grid), grid) and (grid == 0).any()  # stuck, not solved
            assert np.array_equal(grid[grid != 0], solution[grid != 0])  # every filled cell right


def test_all_stuck_grids_are_cached_apart_from_the_first_ones(tmp_path: Path) -> None:
    task = _task(tmp_path)
    train = task.load_splits()["train"]
    first, every = task.load_stuck_points(train), task.load_stuck_points(train, "all")
    assert task.cache_path().with_suffix(".stuck_all.npz").is_file()
    puzzles, solutions = puzzles_and_solutions(train.tokens.numpy(), train.answer_mask.numpy())
    expected = [(grid, solution) for puzzle, solution in zip(puzzles, solutions)
                for grid in stuck_grids(puzzle, solution)]
    assert len(every) == len(expected) > len(first)
    grids, answers = puzzles_and_solutions(every.tokens.numpy(), every.answer_mask.numpy())
    assert all(np.array_equal(g, e) and np.array_equal(a, s) for g, a, (e, s) in zip(grids, answers, expected))
    firsts = {g.tobytes() for g in puzzles_and_solutions(first.tokens.numpy(), first.answer_mask.numpy())[0]}
    assert firsts < {g.tobytes() for g in grids}
    data = PuzzleDataModule(task, batch_size=8, eval_batch_size=8, val_examples=8, seed=0, stuck_fraction=0.25,
                            stuck_grids="all")
    data.prepare_data()
    assert torch.equal(data.stuck.tokens, every.tokens)


def test_stuck_points_are_cached_beside_the_splits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task(tmp_path)
    train = task.load_splits()["train"]
    first = task.load_stuck_points(train)
    assert task.cache_path().with_suffix(".stuck.npz").is_file()

    def recompute(examples):
        raise AssertionError("the cache was not read")

    monkeypatch.setattr(task, "stuck_points", recompute)
    again = task.load_stuck_points(train)
    assert torch.equal(again.tokens, first.tokens) and torch.equal(again.answer_mask, first.answer_mask)


def test_a_split_that_singles_solve_entirely_is_one_clear_error(tmp_path: Path) -> None:
    task = _task(tmp_path, n_givens=60, n_train=30)
    with pytest.raises(ConfigError, match="naked and hidden singles solve every training example"):
        task.load_stuck_points(task.load_splits()["train"])


def test_each_batch_takes_its_share_from_each_pool_and_replays_from_any_step() -> None:
    plain = (torch.zeros(50, 3, dtype=torch.long), torch.arange(50))
    stuck = (torch.ones(7, 3, dtype=torch.long), torch.arange(7))

    def batches(start: int, count: int) -> list[tuple[torch.Tensor, ...]]:
        stream = iter(StepIndexedBatches([(plain, 6), (stuck, 2)], seed=3, start_step=start, rank=0, world_size=1))
        return [next(stream) for _ in range(count)]

    whole = batches(0, 5)
    for tokens, _ in whole:
        assert tokens.shape == (8, 3)
        assert (tokens[:6] == 0).all() and (tokens[6:] == 1).all()
    assert len({tuple(index.tolist()) for _, index in whole}) == 5  # fresh rows every step
    for a, b in zip(whole[3:], batches(3, 2)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_data_module_mixes_stuck_points_into_training_batches_only(tmp_path: Path) -> None:
    task = _task(tmp_path)
    data = PuzzleDataModule(task, batch_size=8, eval_batch_size=8, val_examples=8, seed=0, stuck_fraction=0.25)
    data.prepare_data()
    tokens, answer_mask = next(iter(data.train_dataloader()))
    puzzles = puzzles_and_solutions(tokens.numpy(), answer_mask.numpy())[0]
    assert data.stuck_rows == 2
    assert all(grade_puzzle(p).left_by_singles == grade_puzzle(p).blanks for p in puzzles[6:])  # stuck grids
    assert all(grade_puzzle(p).left_by_singles < grade_puzzle(p).blanks for p in puzzles[:6])  # raw puzzles
    _, val_mask = next(iter(data.val_dataloader()))
    assert torch.equal(val_mask, data.splits["val"].head(8).answer_mask)  # validation stays as it was


def test_stuck_rows_carry_their_masking_rate_through_augmentation(tmp_path: Path) -> None:
    task = _task(tmp_path)
    plain = PuzzleDataModule(task, batch_size=8, eval_batch_size=8, val_examples=8, seed=0, augment=True,
                             stuck_fraction=0.25)
    rated = PuzzleDataModule(task, batch_size=8, eval_batch_size=8, val_examples=8, seed=0, augment=True,
                             stuck_fraction=0.25, stuck_mask_rate=1.0)
    for data in (plain, rated):
        data.prepare_data()
    tokens, answer_mask = next(iter(plain.train_dataloader()))
    rated_tokens, rated_mask, rate = next(iter(rated.train_dataloader()))
    assert torch.equal(rated_tokens, tokens) and torch.equal(rated_mask, answer_mask)  # the same rows, augmented
    assert torch.isnan(rate[:6]).all() and (rate[6:] == 1.0).all()


def test_training_steps_hand_the_stuck_rows_rate_to_the_objective(monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.training.module import MDMModule

    module = MDMModule(to_container(compose_config("train", ["model=tiny"])))
    seen = {}

    def objective(network, tokens, answer_mask, mask_id, generator, *rates):
        seen.update(zip(["fixed_rate"], rates))  # MaskedDiffusionLoss's argument after the generator
        return tokens.float().sum() * 0, {}

    monkeypatch.setattr(module, "objective", objective)
    monkeypatch.setattr(module, "log", lambda *args, **kwargs: None)
    monkeypatch.setattr(MDMModule, "global_step", property(lambda self: 0))  # no trainer attached
    monkeypatch.setattr("mdmkit.training.module.step_generator", lambda module, step: torch.Generator())
    monkeypatch.setattr("mdmkit.training.module.loss_on_progress_bar", lambda module: False)
    tokens, answer_mask = torch.zeros(4, 89, dtype=torch.long), torch.ones(4, 89, dtype=torch.bool)
    module.training_step((tokens, answer_mask), 0)
    assert seen == {}
    rate = torch.tensor([float("nan"), float("nan"), 1.0, 1.0])
    module.training_step((tokens, answer_mask, rate), 0)
    assert seen["fixed_rate"] is rate


@pytest.mark.parametrize("value", ["0", "0.0", "1.5", "-1", "true", "all"])
def test_a_bad_stuck_mask_rate_stops_before_training(value: str) -> None:
    with pytest.raises(ConfigError, match=r"data.stuck_mask_rate=\S+ must be null .* or a number in \(0, 1\]"):
        check_run(compose_config("train", ["data.stuck_fraction=0.25", f"data.stuck_mask_rate={value}"]))


def test_bad_stuck_grids_stop_before_training() -> None:
    with pytest.raises(ConfigError, match="data.stuck_grids=all picks the stuck rows: set data.stuck_fraction > 0"):
        check_run(compose_config("train", ["data.stuck_grids=all"]))
    with pytest.raises(ConfigError, match="data.stuck_grids=some must be one of first, all"):
        check_components(to_container(compose_config("train", ["data.stuck_fraction=0.25", "data.stuck_grids=some"])))
    check_components(to_container(compose_config("train", ["data.stuck_fraction=0.25", "data.stuck_grids=all"])))


def test_a_stuck_mask_rate_needs_stuck_rows_and_an_objective_that_takes_rates() -> None:
    with pytest.raises(ConfigError, match="set data.stuck_fraction > 0 too"):
        check_run(compose_config("train", ["data.stuck_mask_rate=1.0"]))
    speculative = to_container(compose_config("train", ["experiment=sudoku_speculative", "data.stuck_fraction=0.25",
                                                "data.stuck_mask_rate=1.0"]))
    with pytest.raises(ConfigError, match="objective SpeculativeLoss does not take"):
        check_components(speculative)
    check_components(to_container(compose_config("train", ["data.stuck_fraction=0.25", "data.stuck_mask_rate=1"])))


@pytest.mark.parametrize("value", ["1.0", "-0.1", "0.97", "true", "many"])
def test_a_bad_stuck_fraction_stops_before_training(value: str) -> None:
    with pytest.raises(ConfigError, match=r"data.stuck_fraction=\S+ must be a number in \[0, 1\) that leaves rows"):
        check_run(compose_config("train", [f"data.stuck_fraction={value}", "data.batch_size=16"]))


def test_a_batch_of_one_has_no_row_to_share() -> None:
    with pytest.raises(ConfigError, match="leaves rows of each batch of 1 to the training split"):
        check_run(compose_config("train", ["data.stuck_fraction=0.1", "data.batch_size=1"]))


def test_stuck_fraction_needs_a_task_with_deductions_and_no_indicator() -> None:
    maze = to_container(compose_config("train", ["experiment=maze_mdm", "data.stuck_fraction=0.25"]))
    with pytest.raises(ConfigError, match="task maze defines no deductions"):
        check_components(maze)
    with pytest.raises(ConfigError, match="an indicator trains on recorded trajectories, not on puzzles"):
        check_run(compose_config("train", ["experiment=sudoku_indicator", "data.stuck_fraction=0.25"]))
    check_components(to_container(compose_config("train", ["data.stuck_fraction=0.25"])))


def test_train_py_trains_on_augmented_batches_with_stuck_points(tmp_path: Path) -> None:
    result = run_cli("train.py", *TINY, "task.n_givens=[24,30]", "data.augment=true", "data.stuck_fraction=0.25",
                     "data.stuck_mask_rate=1.0", "data.stuck_grids=all", "eval_limit=8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "augmented by digit relabelling" in result.stdout
    assert ("2 of 8 rows a batch stuck after naked and hidden singles (each time on a solve), masked at rate 1.0"
            in result.stdout)

"""Training-time Sudoku symmetries (data.augment=true): exact validity, the whole group reached, replay on resume."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from conftest import compose_config

from mdmkit.core.config import to_container
from mdmkit.core.errors import ConfigError
from mdmkit.tasks.sudoku import EOL, SudokuTask
from mdmkit.tasks.sudoku_generator import find_solutions, is_valid_solution
from mdmkit.tasks.sudoku_symmetry import random_symmetries
from mdmkit.training.datamodule import StepIndexedBatches
from mdmkit.training.preflight import build_parts, check_run
from mdmkit.training.run_config import DataConfig

CELLS = np.array([row * 10 + col for row in range(9) for col in range(9)])


@pytest.fixture(scope="module")
def examples() -> tuple[torch.Tensor, torch.Tensor]:
    task = SudokuTask(n_givens=(24, 36), n_train=1, n_val=1, n_test=1)
    made = task.generate(6, seed=3)
    return torch.from_numpy(made.tokens), torch.from_numpy(made.answer_mask)


def test_each_augmented_puzzle_is_valid_and_its_givens_determine_the_new_solution(examples) -> None:
    tokens, mask = examples
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        new_tokens, new_mask = SudokuTask().augment(tokens, mask, generator)
        assert (new_tokens[:, 9::10] == EOL).all() and not new_mask[:, 9::10].any()
        assert (new_mask.sum(1) == mask.sum(1)).all()  # as many givens: the same difficulty class
        for row, blanks in zip(new_tokens.numpy(), new_mask.numpy()):
            grid = row[CELLS] + 1
            assert is_valid_solution(grid)
            puzzle = np.where(blanks[CELLS], 0, grid)
            solutions = find_solutions(puzzle, limit=2)
            assert len(solutions) == 1 and (solutions[0] == grid).all()
    assert not torch.equal(new_tokens, tokens)
    assert torch.equal(tokens, examples[0])  # the stored split is left as it was


def test_the_symmetries_move_a_cell_anywhere_and_a_digit_to_any_label() -> None:
    """Cell 0 (top left) lands on each of the 81 cells with probability 1/81 under the group, and digit 0 takes
    each of the 9 labels with probability 1/9: the empirical counts of 16,200 draws stay within 5 sigma."""
    draws = 16_200
    cells = torch.arange(81).repeat(draws, 1) % 9  # any [B, 81] digit ids will do to follow the cells
    marker = torch.zeros(draws, 81, dtype=torch.bool)
    marker[:, 0] = True
    grids, moved = random_symmetries(cells, marker, torch.Generator().manual_seed(1))
    landing = Counter(moved.int().argmax(1).tolist())
    label = Counter(grids[moved].tolist())
    for counts, outcomes in ((landing, 81), (label, 9)):
        p = 1 / outcomes
        sigma = (draws * p * (1 - p)) ** 0.5
        assert len(counts) == outcomes
        assert all(abs(n - draws * p) < 5 * sigma for n in counts.values()), counts


def test_half_the_draws_transpose() -> None:
    """Row 0 of a grid whose rows are constant ends up as a row (no transpose) or as a column (transpose)."""
    draws = 4000
    cells = torch.arange(81).div(9, rounding_mode="floor").repeat(draws, 1)  # cell (r, c) holds digit r
    grids, _ = random_symmetries(cells, torch.zeros(draws, 81, dtype=torch.bool), torch.Generator().manual_seed(2))
    rows_constant = (grids.view(draws, 9, 9) == grids.view(draws, 9, 9)[:, :, :1]).all()
    transposed = (grids.view(draws, 9, 9)[:, :1, :] == grids.view(draws, 9, 9)[:, :, :]).all(1).all(1)
    assert not rows_constant
    assert abs(transposed.float().mean().item() - 0.5) < 5 * (0.25 / draws) ** 0.5


def test_augmented_batches_replay_exactly_from_any_step(examples) -> None:
    tokens, mask = examples
    task = SudokuTask()

    def batches(start: int, count: int) -> list[tuple[torch.Tensor, ...]]:
        stream = iter(StepIndexedBatches((tokens, mask), 4, seed=7, start_step=start, rank=0, world_size=1,
                                         transform=task.augment))
        return [next(stream) for _ in range(count)]

    whole, resumed = batches(0, 5), batches(3, 2)
    for a, b in zip(whole[3:], resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    plain = next(iter(StepIndexedBatches((tokens, mask), 4, seed=7, start_step=0, rank=0, world_size=1)))
    assert not torch.equal(plain[0], whole[0][0])  # the transform ran


def test_augment_is_checked_before_training() -> None:
    arithmetic = to_container(compose_config("train", ["experiment=arithmetic_mdm", "data.augment=true"]))
    with pytest.raises(ConfigError, match="task arithmetic defines no symmetries"):
        build_parts(arithmetic, DataConfig.from_config(arithmetic["data"]))
    with pytest.raises(ConfigError, match="data: augment='yes': expected bool"):
        check_run(compose_config("train", ["data.augment=yes"]))
    with pytest.raises(ConfigError, match="an indicator trains on recorded trajectories"):
        check_run(compose_config("train", ["experiment=sudoku_indicator", "data.augment=true"]))
    sudoku = to_container(compose_config("train", ["data.augment=true"]))
    build_parts(sudoku, DataConfig.from_config(sudoku["data"]))  # Sudoku has them

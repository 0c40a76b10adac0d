"""The compact Sudoku encoding: exact round trips, loud failures on unsolved grids and on corrupt codes."""

from __future__ import annotations

import numpy as np
import pytest

from mdmkit.core.errors import DataFormatError
from mdmkit.tasks.sudoku_codec import decode_grids, encode_grids, pack_puzzles, unpack_puzzles
from mdmkit.tasks.sudoku_generator import generate_puzzles

SOLUTION = np.array([int(c) for c in "534678912672195348198342567859761423426853791713924856961537284"
                                     "287419635345286179"])


def variants(grid: np.ndarray) -> np.ndarray:
    """The grid, its transpose, a digit relabelling and a band swap: solved grids with different codes."""
    rows = grid.reshape(9, 9)
    relabelled = np.roll(np.arange(1, 10), 4)[rows - 1]
    bands_swapped = np.concatenate([rows[3:6], rows[:3], rows[6:]])
    return np.stack([rows, rows.T, relabelled, bands_swapped]).reshape(-1, 81)


def test_generated_puzzles_round_trip_exactly() -> None:
    puzzles, solutions = generate_puzzles(120, (24, 36), seed=5)
    packed = pack_puzzles(puzzles, solutions)
    assert packed["codes"].shape == (120, 2) and packed["givens"].shape == (120, 11)  # 27 bytes a puzzle
    back_puzzles, back_solutions = unpack_puzzles(**packed)
    np.testing.assert_array_equal(back_puzzles, puzzles)
    np.testing.assert_array_equal(back_solutions, solutions)


def test_distinct_grids_get_distinct_codes_and_decode_back() -> None:
    grids = variants(SOLUTION)
    codes = encode_grids(grids)
    assert len({tuple(c) for c in codes.tolist()}) == len(grids)
    np.testing.assert_array_equal(decode_grids(codes), grids)
    # the first cell holds digit 5: index 4 of the nine it may hold, the lowest place of the first code
    assert codes[0, 0] % 9 == 4


def test_every_and_no_cell_given_round_trip() -> None:
    grids = variants(SOLUTION)[:2]
    puzzles = grids.copy()
    puzzles[1] = 0
    back_puzzles, back_solutions = unpack_puzzles(**pack_puzzles(puzzles, grids))
    np.testing.assert_array_equal(back_puzzles, puzzles)
    np.testing.assert_array_equal(back_solutions, grids)


def test_an_unsolved_grid_is_refused() -> None:
    repeated = SOLUTION.copy()
    repeated[1] = repeated[0]  # row 0 now holds a digit twice
    with pytest.raises(ValueError, match="cell 1 repeats a digit"):
        encode_grids(repeated)
    with pytest.raises(ValueError, match="digits 1..9"):
        encode_grids(np.where(np.arange(81) == 40, 0, SOLUTION))
    with pytest.raises(ValueError, match="given differs"):
        pack_puzzles(np.where(np.arange(81) == 0, 1, 0), SOLUTION)  # given 1 where the solution has 5


def choices(grid: np.ndarray, cells: range) -> int:
    """How many ways `cells` (row-major) could be filled given the cells before them: the radices' product."""
    rows = grid.reshape(9, 9)
    product = 1
    for cell in cells:
        r, c = divmod(cell, 9)
        before = [(i, j) for i in range(9) for j in range(9) if i * 9 + j < cell]
        used = {rows[i, j] for i, j in before if i == r or j == c or (i // 3, j // 3) == (r // 3, c // 3)}
        product *= 9 - len(used)
    return product


def test_corrupt_codes_fail_loudly() -> None:
    codes = encode_grids(SOLUTION)
    past_the_end = codes.copy()
    past_the_end[0, 0] += np.uint64(choices(SOLUTION, range(36)))  # the same digits, with 1 left over
    with pytest.raises(DataFormatError, match="bits left"):
        decode_grids(past_the_end)
    garbage = codes.copy()
    garbage[0, 1] = np.uint64(2**63)
    with pytest.raises(DataFormatError, match="is corrupt"):  # here a cell runs out of digits first
        decode_grids(garbage)
    with pytest.raises(DataFormatError, match="2 codes but 1"):
        unpack_puzzles(np.concatenate([codes, codes]), np.packbits(np.ones((1, 81), bool), axis=1))

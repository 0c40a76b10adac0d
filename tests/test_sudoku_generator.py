"""Sudoku generator: the solver counts right, puzzles are unique with exact givens, datasets reproduce."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import WAIT_S

from mdmkit.tasks import sudoku_generator
from mdmkit.tasks.sudoku_generator import count_solutions, generate_puzzles, is_consistent, is_valid_solution


def cells(text: str) -> np.ndarray:
    return np.array([int(ch) for ch in text], dtype=np.int8)


# The puzzle from Wikipedia's "Sudoku" article and its published solution, typed in, not generated.
CLASSIC = cells("530070000600195000098000060800060003400803001700020006060000280000419005000080079")
CLASSIC_SOLUTION = cells("534678912672195348198342567859761423426853791713924856961537284287419635345286179")


def test_classic_puzzle_has_its_known_unique_solution() -> None:
    assert count_solutions(CLASSIC) == 1
    assert count_solutions(CLASSIC.tolist(), limit=5) == 1
    assert is_valid_solution(CLASSIC_SOLUTION) and is_consistent(CLASSIC, CLASSIC_SOLUTION)
    # The solver's one solution is the literal one: each blank admits the published digit and nothing else.
    for cell in np.flatnonzero(CLASSIC == 0)[:10]:
        for digit in range(1, 10):
            trial = CLASSIC.copy()
            trial[cell] = digit
            assert count_solutions(trial) == (digit == CLASSIC_SOLUTION[cell])


def test_underdetermined_puzzles_count_up_to_the_limit() -> None:
    empty = np.zeros(81, dtype=np.int8)
    assert count_solutions(empty) == 2
    assert count_solutions(empty, limit=7) == 7
    assert count_solutions(empty, limit=1) == 1
    top_band = np.where(np.arange(81) < 27, CLASSIC_SOLUTION, 0)
    assert count_solutions(top_band) == 2


def test_contradictory_puzzles_have_no_solution() -> None:
    clash = np.zeros(81, dtype=np.int8)
    clash[[0, 8]] = 5  # two 5s in row 0
    assert count_solutions(clash) == 0
    # No two givens clash, yet cell 0 must be 9 (the rest of its row holds 1..8) and its column has a 9.
    hidden = np.zeros(81, dtype=np.int8)
    hidden[1:9] = np.arange(1, 9)
    hidden[9] = 9
    assert count_solutions(hidden) == 0
    wrong = CLASSIC_SOLUTION.copy()
    wrong[[0, 1]] = wrong[[1, 0]]
    assert count_solutions(wrong) == 0


def test_solution_predicates() -> None:
    assert not is_valid_solution(np.zeros(81, dtype=np.int8))
    swapped = CLASSIC_SOLUTION.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # rows stay permutations, columns do not
    assert not is_valid_solution(swapped)
    assert not is_valid_solution(np.tile(np.arange(1, 10), 9))  # rows fine, columns constant
    assert not is_consistent(CLASSIC, swapped)
    assert is_consistent(np.zeros(81, dtype=np.int8), swapped)


@pytest.mark.parametrize("n_givens", [36, 30, 25])
def test_generated_puzzles_are_unique_with_exact_givens(n_givens: int) -> None:
    puzzles, solutions = generate_puzzles(20, n_givens, seed=0)
    assert puzzles.shape == solutions.shape == (20, 81)
    assert puzzles.dtype == solutions.dtype == np.int8
    assert ((puzzles > 0).sum(1) == n_givens).all()
    assert puzzles.min() >= 0 and puzzles.max() <= 9
    for puzzle, solution in zip(puzzles, solutions):
        assert is_valid_solution(solution) and is_consistent(puzzle, solution)
        assert count_solutions(puzzle) == 1
    assert len({p.tobytes() for p in puzzles}) == len({s.tobytes() for s in solutions}) == 20


def test_givens_range_is_inclusive_and_drawn_per_puzzle() -> None:
    puzzles, _ = generate_puzzles(40, (28, 31), seed=1)
    counts = (puzzles > 0).sum(1)
    assert set(counts.tolist()) == {28, 29, 30, 31}
    assert all(count_solutions(p) == 1 for p in puzzles)
    listed, _ = generate_puzzles(40, [28, 31], seed=1)  # a list, as a config file gives it
    np.testing.assert_array_equal(listed, puzzles)


def test_seeded_and_independent_of_workers() -> None:
    one = generate_puzzles(30, 32, seed=3)
    again = generate_puzzles(30, 32, seed=3)
    pooled = generate_puzzles(30, 32, seed=3, workers=2, progress=True)
    for a, b, c in zip(one, again, pooled):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    # A prefix is the same puzzles: puzzle i depends on (seed, i) only, not on n or the chunking.
    np.testing.assert_array_equal(generate_puzzles(7, 32, seed=3)[0], one[0][:7])
    other = generate_puzzles(30, 32, seed=4)
    assert not {p.tobytes() for p in other[0]} & {p.tobytes() for p in one[0]}


def test_spawned_workers_match() -> None:
    """'spawn' workers re-import the module instead of inheriting it; the result must not change."""
    script = (
        "import multiprocessing as mp, sys\n"
        "mp.set_start_method('spawn')\n"
        "from mdmkit.tasks.sudoku_generator import generate_puzzles\n"
        "puzzles, solutions = generate_puzzles(12, 34, seed=5, workers=2)\n"
        "sys.stdout.write(puzzles.tobytes().hex() + solutions.tobytes().hex())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    puzzles, solutions = generate_puzzles(12, 34, seed=5)
    assert done.stdout == puzzles.tobytes().hex() + solutions.tobytes().hex()


def test_unreachable_givens_raise_and_name_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sudoku_generator, "_MAX_GRIDS", 3)  # the real bound takes ~2 s to run out
    with pytest.raises(ValueError, match="n_givens=17"):
        generate_puzzles(1, 17, seed=0)


@pytest.mark.parametrize(
    "bad",
    [np.zeros(80, int), np.zeros(82, int), np.full(81, 10), np.full(81, -1), np.zeros(81, float), [0] * 80],
)
def test_bad_puzzles_raise(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="sudoku puzzle"):
        count_solutions(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_givens": 16},
        {"n_givens": 82},
        {"n_givens": (30, 20)},
        {"n_givens": (20, 30, 40)},
        {"n_givens": 30.0},
        {"n": -1},
        {"workers": 0},
        {"seed": -1},
    ],
)
def test_bad_generation_arguments_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate_puzzles(**{"n": 2, "n_givens": 30, "seed": 0, **kwargs})


def test_other_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="limit"):
        count_solutions(CLASSIC, limit=0)
    with pytest.raises(ValueError, match="81 cells"):
        is_valid_solution(CLASSIC_SOLUTION[:80])
    with pytest.raises(ValueError, match="81 cells"):
        is_consistent(CLASSIC, CLASSIC_SOLUTION[:80])

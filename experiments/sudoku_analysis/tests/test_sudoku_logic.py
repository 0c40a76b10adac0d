"""Sudoku logic grades: the fast grader agrees with a plain, slow reading of the two rules, on typed-in puzzles
and generated ones."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.sudoku_analysis.sudoku_logic import BEYOND, HIDDEN, NAKED, grade_puzzle, singles_closure
from mdmkit.tasks.sudoku_generator import find_solutions, generate_puzzles


def cells(text: str) -> np.ndarray:
    return np.array([int(ch) for ch in text.replace(".", "0")], dtype=np.int8)


CLASSIC = cells("530070000600195000098000060800060003400803001700020006060000280000419005000080079")
# Arto Inkala's "AI Escargot" (2006), published as needing techniques far beyond singles; typed in.
ESCARGOT = cells("1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3..")


def slow_singles(puzzle: np.ndarray, hidden: bool) -> np.ndarray:
    """The rules as a person applies them, one fill at a time, with candidates recomputed from the grid."""
    grid = puzzle.reshape(9, 9).copy()

    def allowed(r: int, c: int) -> set[int]:
        box = grid[r // 3 * 3:r // 3 * 3 + 3, c // 3 * 3:c // 3 * 3 + 3]
        return set(range(1, 10)) - set(grid[r]) - set(grid[:, c]) - set(box.ravel())

    def units():
        for k in range(9):
            yield [(k, c) for c in range(9)]
            yield [(r, k) for r in range(9)]
            yield [(k // 3 * 3 + i // 3, k % 3 * 3 + i % 3) for i in range(9)]

    progress = True
    while progress:
        progress = False
        for r, c in zip(*np.nonzero(grid == 0)):
            options = allowed(r, c)
            if len(options) == 1:
                grid[r, c] = options.pop()
                progress = True
        if hidden and not progress:
            for unit in units():
                for digit in set(range(1, 10)) - {int(grid[p]) for p in unit}:
                    places = [p for p in unit if grid[p] == 0 and digit in allowed(*p)]
                    if len(places) == 1:
                        grid[places[0]] = digit
                        progress = True
    return grid.ravel()


def test_one_blank_is_a_naked_single() -> None:
    solution = find_solutions(CLASSIC)[0]
    puzzle = solution.copy()
    puzzle[40] = 0
    assert grade_puzzle(puzzle) == grade_puzzle(puzzle.tolist())
    grade = grade_puzzle(puzzle)
    assert (grade.grade, grade.blanks, grade.left_by_naked, grade.left_by_singles) == (NAKED, 1, 0, 0)


def test_escargot_is_beyond_singles_and_the_classic_is_not() -> None:
    escargot = grade_puzzle(ESCARGOT)
    assert escargot.grade == BEYOND and escargot.blanks == 81 - 23
    assert escargot.left_by_singles == np.count_nonzero(slow_singles(ESCARGOT, hidden=True) == 0) > 0
    assert grade_puzzle(CLASSIC).grade in (NAKED, HIDDEN)


def test_grades_match_the_slow_rules_on_generated_puzzles() -> None:
    puzzles, solutions = generate_puzzles(150, (22, 36), seed=11)
    seen = set()
    for puzzle, solution in zip(puzzles, solutions):
        grade = grade_puzzle(puzzle)
        naked, singles = slow_singles(puzzle, hidden=False), slow_singles(puzzle, hidden=True)
        assert grade.blanks >= grade.left_by_naked >= grade.left_by_singles
        assert grade.left_by_naked == np.count_nonzero(naked == 0)
        assert grade.left_by_singles == np.count_nonzero(singles == 0)
        filled = singles != 0
        assert (singles[filled] == solution[filled]).all()  # the rules only ever write the solution's digits
        closure = singles_closure(puzzle)
        assert (closure == singles).all()
        stuck = grade_puzzle(closure)
        assert stuck.blanks == grade.left_by_singles == stuck.left_by_naked == stuck.left_by_singles
        seen.add(grade.grade)
    assert seen == {NAKED, HIDDEN, BEYOND}  # the split at 22-36 givens holds all three


def _two_nines() -> np.ndarray:
    """No two givens clash, yet both ends of row 0 must be 9: an 8 sits in each of their columns."""
    puzzle = np.zeros(81, dtype=np.int8)
    puzzle[1:8] = np.arange(1, 8)
    puzzle[[9, 26]] = 8  # row 1 column 0, row 2 column 8
    return puzzle


@pytest.mark.parametrize("bad, message", [
    (np.zeros(80, dtype=np.int8), "81 cells"),
    (np.full(81, 10), "0 \\(blank\\) or 1..9"),
    (np.array([5] + [0] * 7 + [5] + [0] * 72), "contradict"),
    (np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] + [0] * 71), "contradict"),  # cell 0 must be 9; column 0 has one
    (_two_nines(), "no solution"),
])
def test_bad_puzzles_raise_one_clear_error(bad: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        grade_puzzle(bad)

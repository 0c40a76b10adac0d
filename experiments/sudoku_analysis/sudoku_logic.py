"""How much logic a Sudoku puzzle needs: the simplest deduction rules that solve it, and what they leave.

Givens count only roughly for difficulty. A puzzle that repeated naked singles (a cell with one candidate left)
solve asks a model to propagate constraints; one that also needs hidden singles (a digit with one place left in a
row, column or box) asks it to reason over a unit; one that singles cannot finish needs pairs, chains or a guess.
Grading the test split this way tells whether a model's failures are the puzzles that need more than singles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mdmkit.tasks.sudoku_generator import ALL_DIGITS, PEERS, UNITS_OF, propagate_naked_singles, puzzle_cells

_UNITS = tuple(tuple(i for i in range(81) if unit in UNITS_OF[i]) for unit in range(27))

NAKED = "naked singles"
HIDDEN = "hidden singles"
BEYOND = "beyond singles"
GRADES = (NAKED, HIDDEN, BEYOND)


@dataclass(frozen=True)
class LogicGrade:
    """`grade`: the simplest rule set in GRADES that solves the puzzle. `left_by_naked` / `left_by_singles`:
    blank cells still undecided after naked singles alone / after naked and hidden singles together."""

    grade: str
    blanks: int
    left_by_naked: int
    left_by_singles: int


def grade_puzzle(puzzle: np.ndarray | Sequence[int]) -> LogicGrade:
    """Grade one puzzle (81 ints, 0 = blank). A ValueError for a malformed one or one whose givens clash."""
    values = puzzle_cells(puzzle).tolist()
    cand = _candidates(values)
    left_by_naked = _undecided(cand)
    _hidden_singles(cand)
    left_by_singles = _undecided(cand)
    grade = NAKED if left_by_naked == 0 else HIDDEN if left_by_singles == 0 else BEYOND
    return LogicGrade(grade, values.count(0), left_by_naked, left_by_singles)


def singles_closure(puzzle: np.ndarray | Sequence[int]) -> np.ndarray:
    """The puzzle with every cell naked and hidden singles decide filled in (81 ints, 0 = still blank): for a
    puzzle beyond singles, the grid where a solver that knows only singles gets stuck."""
    cand = _candidates(puzzle_cells(puzzle).tolist())
    _hidden_singles(cand)
    return _grid(cand)


def _grid(cand: list[int]) -> np.ndarray:
    """81 ints: each decided cell's digit, 0 where candidates remain."""
    return np.array([0 if mask & (mask - 1) else mask.bit_length() for mask in cand], dtype=np.int64)


def _candidates(values: list[int]) -> list[int]:
    """Candidate masks after placing the givens and playing naked singles to the end."""
    cand = [ALL_DIGITS] * 81
    for cell, value in enumerate(values):
        if value and not _place(cand, cell, 1 << (value - 1)):
            raise ValueError(f"sudoku puzzle givens contradict each other (cell {cell}, digit {value})")
    if not propagate_naked_singles(cand, [cell for cell, mask in enumerate(cand) if not mask & (mask - 1)]):
        raise ValueError("sudoku puzzle has no solution: naked singles reach a contradiction")
    return cand


def _hidden_singles(cand: list[int]) -> None:
    """Play hidden singles (each followed by naked singles) until none is left."""
    while (cell := _hidden_single(cand)) is not None:
        if not propagate_naked_singles(cand, [cell]):
            raise ValueError("sudoku puzzle has no solution: singles reach a contradiction")


def _place(cand: list[int], cell: int, bit: int) -> bool:
    """Set `cell` to the digit `bit` and strike it from the cell's peers; False if that empties a peer."""
    if not cand[cell] & bit:
        return False
    cand[cell] = bit
    for peer in PEERS[cell]:
        if cand[peer] & bit:
            cand[peer] &= ~bit
            if not cand[peer]:
                return False
    return True


def _hidden_single(cand: list[int]) -> int | None:
    """Place one digit that has a single possible cell in some unit and return the cell; None when there is none."""
    for unit in _UNITS:
        for k in range(9):
            bit = 1 << k
            places = [cell for cell in unit if cand[cell] & bit]
            if len(places) == 1 and cand[places[0]] != bit:
                cand[places[0]] = bit
                return places[0]
    return None


def _undecided(cand: list[int]) -> int:
    return sum(1 for mask in cand if mask & (mask - 1))

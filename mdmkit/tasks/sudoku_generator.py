"""Sudoku puzzles with a unique solution, fast enough in pure Python + numpy for 100k-example datasets.

A puzzle is made by filling a random solved grid and then blanking its cells in random order, keeping a
removal only if the solution stays unique. Most removals are decided without search (the blanked digit is
still forced by a single elimination step); the rest ask a bitmask solver whether the blanked cell can hold
any *other* digit, which is cheaper than counting solutions because the answer is usually a quick
contradiction. Every puzzle depends only on (seed, index), so results do not depend on `workers`.

Cells are 0..80 in row-major order; in candidate masks digit d is the bit 1 << (d - 1).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from functools import partial

import numpy as np

from mdmkit.tasks.chunks import in_chunks

ALL_DIGITS = 0x1FF  # all nine digits
_ROW = tuple(i // 9 for i in range(81))
_COL = tuple(i % 9 for i in range(81))
_BOX = tuple(i // 27 * 3 + i % 9 // 3 for i in range(81))
PEERS = tuple(
    tuple(j for j in range(81) if j != i and (_ROW[i] == _ROW[j] or _COL[i] == _COL[j] or _BOX[i] == _BOX[j]))
    for i in range(81)
)
# A cell's row, column and box as indices into one list of 27 unit masks (rows, then columns, then boxes).
UNITS_OF = tuple((_ROW[i], 9 + _COL[i], 18 + _BOX[i]) for i in range(81))
# The other cells of each of a cell's three units, for the hidden-single test.
_UNIT_MATES = tuple(
    tuple(tuple(j for j in range(81) if j != i and unit[j] == unit[i]) for unit in (_ROW, _COL, _BOX))
    for i in range(81)
)
_POPCOUNT = tuple(m.bit_count() for m in range(512))
_BITS = tuple(tuple(1 << k for k in range(9) if m >> k & 1) for m in range(512))  # candidates to branch on
_DIGIT = {1 << k: k + 1 for k in range(9)}
_DIAGONAL_BOXES = np.array([i for i in range(81) if _BOX[i] in (0, 4, 8)]).reshape(3, 9)

# Fresh grids tried per puzzle before declaring its n_givens unreachable. Random digging ends at a minimal
# puzzle with 22 or fewer givens for ~4% of grids and 21 or fewer for ~0.1%: 300 grids make 22 reliable
# (failure ~3e-6 per puzzle) and give up on 17-20 after about 2 s.
_MAX_GRIDS = 300
FEWEST_GENERATED_GIVENS = 22  # what tasks may ask of the generator (harder puzzles come from a file)
# Largest number of puzzles sent to a worker at once: small enough for a live progress bar.
_MAX_CHUNK = 500


def _cells(values: np.ndarray | Sequence[int], what: str) -> np.ndarray:
    """81 integers as a flat int array, or a ValueError naming `what` was malformed."""
    cells = np.asarray(values)
    if cells.size != 81:
        raise ValueError(f"a sudoku {what} needs 81 cells, got {cells.size} (shape {cells.shape})")
    if not np.issubdtype(cells.dtype, np.integer):
        raise ValueError(f"a sudoku {what} needs integer cells, got dtype {cells.dtype}")
    return cells.reshape(81).astype(np.int64)


def puzzle_cells(puzzle: np.ndarray | Sequence[int]) -> np.ndarray:
    """Like `_cells`, and every value a blank (0) or a digit, so the solver never sees garbage."""
    cells = _cells(puzzle, "puzzle")
    if cells.min() < 0 or cells.max() > 9:
        values = sorted(set(cells.tolist()))
        raise ValueError(f"sudoku puzzle cells must be 0 (blank) or 1..9, got values {values}")
    return cells


def propagate_naked_singles(cand: list[int], stack: list[int]) -> bool:
    """Remove each newly solved cell's digit from its peers (naked singles); False on a contradiction.

    `stack` holds the solved cells whose digit has not yet been eliminated from their peers.
    """
    peers = PEERS
    while stack:
        i = stack.pop()
        bit = cand[i]
        for j in peers[i]:
            mask = cand[j]
            if mask & bit:
                if mask == bit:
                    return False
                mask ^= bit
                cand[j] = mask
                if not mask & (mask - 1):
                    stack.append(j)
    return True


def _search(cand: list[int], stack: list[int], limit: int, found: list[list[int]]) -> None:
    """Append solutions (as candidate masks) to `found` until it holds `limit` of them or none are left.

    Branches on the cell with the fewest candidates, which keeps the tree tiny for well-constrained puzzles.
    """
    if not propagate_naked_singles(cand, stack):
        return
    best, fewest = -1, 10
    for i, mask in enumerate(cand):
        count = _POPCOUNT[mask]
        if 1 < count < fewest:
            best, fewest = i, count
            if count == 2:
                break
    if best < 0:
        found.append(cand)
        return
    for bit in _BITS[cand[best]]:
        child = cand.copy()
        child[best] = bit
        _search(child, [best], limit, found)
        if len(found) >= limit:
            return


def find_solutions(puzzle: np.ndarray | Sequence[int], limit: int = 2) -> list[np.ndarray]:
    """Solutions of `puzzle` (81 ints, 0 = blank) as int8 grids, at most `limit` of them.

    Stopping at `limit` makes uniqueness checks (limit=2) cheap even for nearly empty puzzles.
    """
    cells = puzzle_cells(puzzle)
    if operator.index(limit) < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    values = cells.tolist()
    cand = [1 << (v - 1) if v else ALL_DIGITS for v in values]
    found: list[list[int]] = []
    _search(cand, [i for i, v in enumerate(values) if v], limit, found)
    return [np.array([mask.bit_length() for mask in masks], dtype=np.int8) for masks in found]


def count_solutions(puzzle: np.ndarray | Sequence[int], limit: int = 2) -> int:
    """Number of solutions of `puzzle`, counted only up to `limit`."""
    return len(find_solutions(puzzle, limit))


def is_valid_solution(grid: np.ndarray | Sequence[int]) -> bool:
    """True if every row, column and box of the 81 cells is a permutation of 1..9."""
    rows = _cells(grid, "grid").reshape(9, 9)
    boxes = rows.reshape(3, 3, 3, 3).swapaxes(1, 2).reshape(9, 9)
    digits = np.arange(1, 10)
    return all(bool((np.sort(units, axis=1) == digits).all()) for units in (rows, rows.T, boxes))


def is_consistent(puzzle: np.ndarray | Sequence[int], grid: np.ndarray | Sequence[int]) -> bool:
    """True if `grid` keeps every given of `puzzle` (blanks may hold anything)."""
    givens = puzzle_cells(puzzle)
    cells = _cells(grid, "grid")
    return bool((cells[givens > 0] == givens[givens > 0]).all())


def _random_grid(rng: np.random.Generator) -> list[int]:
    """A random solved grid, as 81 digits.

    The three diagonal boxes share no unit, so they are filled with independent random permutations and
    the solver completes the rest. Its completion is deterministic, so a random digit relabelling,
    band/stack/row/column shuffle and transpose then remove any positional or digit bias it has.
    """
    found: list[list[int]] = []
    while not found:  # guard: a completion has always existed in practice
        cand = [ALL_DIGITS] * 81
        for box in _DIAGONAL_BOXES:
            for cell, digit in zip(box.tolist(), rng.permutation(9).tolist()):
                cand[cell] = 1 << digit
        _search(cand, _DIAGONAL_BOXES.ravel().tolist(), 1, found)
    digits = rng.permutation(9) + 1
    grid = digits[np.array([_DIGIT[m] for m in found[0]]) - 1].reshape(9, 9)
    rows = (rng.permutation(3)[:, None] * 3 + rng.permuted(np.tile(np.arange(3), (3, 1)), axis=1)).ravel()
    cols = (rng.permutation(3)[:, None] * 3 + rng.permuted(np.tile(np.arange(3), (3, 1)), axis=1)).ravel()
    grid = grid[rows][:, cols]
    return (grid.T if rng.random() < 0.5 else grid).ravel().tolist()


def _allowed(given: list[int], cell: int) -> int:
    """Candidates of a blank cell: the digits not given anywhere in its row, column or box."""
    r, c, b = UNITS_OF[cell]
    return ALL_DIGITS & ~(given[r] | given[c] | given[b])


def _forced(puzzle: list[int], given: list[int], cell: int, bit: int) -> bool:
    """True if blank `cell` must hold `bit` by one elimination step from the givens (naked/hidden single)."""
    return _allowed(given, cell) == bit or any(
        all(puzzle[j] or not _allowed(given, j) & bit for j in mates) for mates in _UNIT_MATES[cell]
    )


def _other_digit_fits(puzzle: list[int], given: list[int], cell: int, bit: int) -> bool:
    """True if the puzzle has a solution with blank `cell` != `bit`, i.e. blanking it broke uniqueness."""
    cand = [0] * 81
    stack = []
    for i, value in enumerate(puzzle):
        if value:
            cand[i] = 1 << (value - 1)
            continue
        mask = _allowed(given, i)
        if i == cell:
            mask ^= bit
        if not mask:
            return False
        if not mask & (mask - 1):
            stack.append(i)
        cand[i] = mask
    found: list[list[int]] = []
    _search(cand, stack, 1, found)
    return bool(found)


def _dig(grid: list[int], order: Iterable[int], n_givens: int) -> list[int] | None:
    """Blank cells of `grid` in `order`, keeping the solution unique, until `n_givens` givens remain.

    Returns None if the order runs out first (the grid has no unique puzzle this small along this order).
    Each removal only needs to rule out other digits in the blanked cell: the puzzle before it had `grid`
    as its only solution, so any new solution must differ exactly there.
    """
    puzzle = grid.copy()
    given = [ALL_DIGITS] * 27  # digits given in each unit
    givens = 81
    for cell in order:
        if givens == n_givens:
            break
        bit = 1 << (grid[cell] - 1)
        units = UNITS_OF[cell]
        for u in units:
            given[u] ^= bit
        puzzle[cell] = 0
        if _forced(puzzle, given, cell, bit) or not _other_digit_fits(puzzle, given, cell, bit):
            givens -= 1
        else:
            for u in units:
                given[u] |= bit
            puzzle[cell] = grid[cell]
    return puzzle if givens == n_givens else None


def _make_puzzle(seed: int, index: int, lo: int, hi: int) -> tuple[list[int], list[int]]:
    """Puzzle number `index` of `seed`: a function of (seed, index) alone, so any worker split agrees."""
    rng = np.random.default_rng([seed, index])
    n_givens = int(rng.integers(lo, hi + 1))
    for _ in range(_MAX_GRIDS):
        grid = _random_grid(rng)
        puzzle = _dig(grid, rng.permutation(81).tolist(), n_givens)
        if puzzle is not None:
            return puzzle, grid
    raise ValueError(
        f"could not reach n_givens={n_givens} with a unique solution from {_MAX_GRIDS} random grids "
        f"(seed={seed}, puzzle {index}); random digging rarely gets below ~22 givens, ask for more"
    )


def _make_chunk(start: int, stop: int, *, seed: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Puzzles start..stop-1 as int8 arrays (module level, so 'spawn' workers can unpickle it)."""
    pairs = [_make_puzzle(seed, index, lo, hi) for index in range(start, stop)]
    out = np.array(pairs, dtype=np.int8).reshape(stop - start, 2, 81)
    return out[:, 0], out[:, 1]


def _givens_range(n_givens: object) -> tuple[int, int]:
    """(lo, hi) from an int or an inclusive pair; any 2-sequence counts, e.g. a list from a config file."""
    pair = tuple(n_givens) if isinstance(n_givens, Sequence) and not isinstance(n_givens, str) else (n_givens, n_givens)
    ints = [int(v) for v in pair if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    if len(pair) != 2 or len(ints) != 2:
        raise ValueError(f"n_givens must be an int or an inclusive (lo, hi) pair of ints, got {n_givens!r}")
    lo, hi = ints
    if not 17 <= lo <= hi <= 81:
        raise ValueError(
            f"n_givens={n_givens!r} must lie in [17, 81] with lo <= hi "
            "(no sudoku with fewer than 17 givens has a unique solution)"
        )
    return lo, hi


def generate_puzzles(
    n: int, n_givens: int | tuple[int, int], seed: int, workers: int = 1, progress: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """`n` puzzles with a unique solution: (puzzles int8 [n, 81] with 0 = blank, solutions int8 [n, 81]).

    `n_givens` is the exact number of givens, or an inclusive (lo, hi) range drawn uniformly per puzzle.
    The result depends only on `seed`; `workers` > 1 spreads chunks over a process pool.
    """
    lo, hi = _givens_range(n_givens)
    if operator.index(n) < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if operator.index(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    puzzles = np.empty((n, 81), dtype=np.int8)
    solutions = np.empty((n, 81), dtype=np.int8)
    make = partial(_make_chunk, seed=seed, lo=lo, hi=hi)
    for start, stop, (part_puzzles, part_solutions) in in_chunks(make, n, workers, _MAX_CHUNK, "sudoku puzzles",
                                                                 "puzzle", progress):
        puzzles[start:stop] = part_puzzles
        solutions[start:stop] = part_solutions
    return puzzles, solutions

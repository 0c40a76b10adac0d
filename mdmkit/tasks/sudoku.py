"""Sudoku infilling (EB-Sampler paper §6.2.2): 89 tokens = 81 cells + 8 end-of-line tokens.

The whole solved grid is the sequence; the blank cells are the answer positions the model infills.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mdmkit.core.config import require
from mdmkit.core.errors import DataFormatError
from mdmkit.tasks.base import Examples, PuzzleTask, digest
from mdmkit.tasks.sudoku_codec import pack_puzzles, unpack_puzzles
from mdmkit.tasks.sudoku_generator import FEWEST_GENERATED_GIVENS, find_solutions, generate_puzzles
from mdmkit.tasks.sudoku_symmetry import random_symmetries

EOL = 9  # token id of the end-of-line token; digits d = 1..9 have ids d - 1
CELL_POSITIONS = np.array([row * 10 + col for row in range(9) for col in range(9)])  # cell -> sequence index
_CELL_INDEX = torch.from_numpy(CELL_POSITIONS)  # the same, to index tensors


def serialize(grids: np.ndarray) -> np.ndarray:
    """[N, 81] digits 1..9 -> [N, 89] token ids with an EOL after each of the first 8 rows."""
    tokens = np.full((grids.shape[0], 89), EOL, dtype=np.int64)
    tokens[:, CELL_POSITIONS] = grids.astype(np.int64) - 1
    return tokens


def puzzles_and_solutions(tokens: np.ndarray, answer_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of a task's examples: [N, 89] tokens and answer masks -> [N, 81] puzzles (0 = blank) and
    solutions (digits 1..9)."""
    solutions = np.asarray(tokens)[:, CELL_POSITIONS] + 1
    return np.where(np.asarray(answer_mask)[:, CELL_POSITIONS], 0, solutions), solutions


@dataclass
class SudokuTask(PuzzleTask):
    """9x9 puzzles with a unique solution and `n_givens` givens (an int, or an inclusive [lo, hi] range)."""

    name = "sudoku"

    n_givens: int | tuple[int, int] = 36  # an int, or an inclusive range [lo, hi] drawn per puzzle
    parallel_generation = True
    stable_prefix = True  # puzzle i depends on (seed, i) only: evaluation makes the test split alone
    symmetries = "digit relabelling, band/stack and row/column permutations, transposition (~1.2e12)"

    def validate(self) -> None:
        super().validate()
        lo, hi = (self.n_givens, self.n_givens) if isinstance(self.n_givens, int) else self.n_givens
        require(lo <= hi, f"n_givens={[lo, hi]} is a range [lo, hi] with lo <= hi")
        require(FEWEST_GENERATED_GIVENS <= lo and hi <= 80,
                f"n_givens={self.n_givens} must lie in [{FEWEST_GENERATED_GIVENS}, 80]: random digging rarely reaches "
                f"fewer givens (harder puzzles: task.test_file=)")

    @property
    def vocab(self) -> tuple[str, ...]:
        return (*"123456789", "\n", "[MASK]")

    @property
    def seq_len(self) -> int:
        return 89

    def settings(self) -> dict:
        return {"n_givens": self.n_givens}

    def examples(self, puzzles: np.ndarray, solutions: np.ndarray) -> Examples:
        """Examples of `puzzles` [N, 81] (0 = blank) and their `solutions` (digits 1..9): any grid, stuck ones too."""
        answer_mask = np.zeros((len(puzzles), 89), dtype=bool)
        answer_mask[:, CELL_POSITIONS] = puzzles == 0
        keys = np.array([digest(p.astype(np.int8).tobytes()) for p in puzzles], dtype="S20")
        return Examples(serialize(solutions), answer_mask, keys)

    def pack(self, examples: Examples) -> dict[str, np.ndarray]:
        """Cached as ~27 bytes a puzzle (sudoku_codec)."""
        return pack_puzzles(*puzzles_and_solutions(examples.tokens, examples.answer_mask))

    def unpack(self, arrays: dict[str, np.ndarray]) -> Examples:
        if set(arrays) != {"codes", "givens"}:
            raise DataFormatError(f"a sudoku cache holds 'codes' and 'givens', this one {sorted(arrays)}")
        return self.examples(*unpack_puzzles(arrays["codes"], arrays["givens"]))

    def generate(self, count: int, seed: int) -> Examples:
        return self.examples(*generate_puzzles(count, self.n_givens, seed, workers=self.workers, progress=True))

    def read_file(self, path: Path) -> Examples:
        """One puzzle per line: 81 characters, digits 1-9 for givens and 0 or '.' for blanks ('#' comments)."""
        puzzles, solutions = [], []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            where = f"{path}:{number}"
            if len(text) != 81 or any(ch not in "0123456789." for ch in text):
                raise DataFormatError(f"{where}: expected 81 characters of 1-9 (givens) and 0 or '.' (blanks)")
            puzzle = np.array([0 if ch == "." else int(ch) for ch in text], dtype=np.int8)
            if puzzle.all():
                raise DataFormatError(f"{where}: every cell is given: nothing to fill")
            solved = find_solutions(puzzle, limit=2)
            if len(solved) != 1:
                raise DataFormatError(f"{where}: puzzle has {'no solution' if not solved else 'several solutions'}")
            puzzles.append(puzzle)
            solutions.append(solved[0])
        if not puzzles:
            raise DataFormatError(f"{path}: no puzzles found")
        return self.examples(np.stack(puzzles), np.stack(solutions))

    def augment(self, tokens: torch.Tensor, answer_mask: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        grids, blanks = random_symmetries(tokens[:, _CELL_INDEX], answer_mask[:, _CELL_INDEX], generator)
        tokens, answer_mask = tokens.clone(), answer_mask.clone()  # the end-of-line tokens stay where they are
        tokens[:, _CELL_INDEX], answer_mask[:, _CELL_INDEX] = grids, blanks
        return tokens, answer_mask

    def score(self, predicted: torch.Tensor, target: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """A prediction counts if its grid is a valid Sudoku and keeps every given."""
        cells = _CELL_INDEX.to(predicted.device)
        grid = predicted[:, cells]
        digits_ok = (grid < 9).all(1)
        one_hot = torch.nn.functional.one_hot(grid.clamp(max=8), 9).view(-1, 9, 9, 9)  # [B, row, col, digit]
        rows_ok = (one_hot.sum(2) == 1).all(-1).all(-1)
        cols_ok = (one_hot.sum(1) == 1).all(-1).all(-1)
        boxes = one_hot.view(-1, 3, 3, 3, 3, 9).sum((2, 4))
        boxes_ok = (boxes == 1).all(-1).all(-1).all(-1)
        givens_kept = ((predicted == target) | answer_mask).all(1)
        return digits_ok & rows_ok & cols_ok & boxes_ok & givens_kept

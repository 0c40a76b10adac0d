"""Maze navigation on DFS mazes (EB-Sampler paper §6.2.1, after Nolte et al. 2024).

Sequence: the maze's n*n-1 edges in shuffled order and orientation (2 cell tokens each), [SEP], start,
goal, [SEP], then an answer region of n*n tokens, written in one of two ways (`answer`):

- `path` (Nolte et al.): the start->goal cells in order, padded with [PAD];
- `cells`: one token per cell, [ON] if the cell lies on the path, else [OFF]. In a tree the set of path cells
  determines the path, so this is the same answer; it lets a model reason locally (a dead end is [OFF]) and
  reveal cells in any order, which is what a parallel sampler can exploit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from mdmkit.core.config import require
from mdmkit.core.errors import DataFormatError
from mdmkit.core.progress import progress_bar
from mdmkit.tasks.base import Examples, PuzzleTask
from mdmkit.tasks.maze_generator import Maze, canonical_key, generate_mazes, maze_path
from mdmkit.tasks.maze_symmetry import random_maze_symmetries


@dataclass
class MazeTask(PuzzleTask):
    """DFS mazes on an n x n grid; `min_path_len` drops trivially short start->goal paths."""

    name = "maze"

    grid_size: int = 4
    min_path_len: int = 2
    # path: the cells in order (Nolte et al.); cells: an [ON]/[OFF] label per cell
    answer: Literal["path", "cells"] = "path"
    parallel_generation = True
    stable_prefix = True  # maze i depends on (seed, i) only: evaluation makes the test split alone
    symmetries = "the square's rotations and reflections (8), edges in a fresh order and orientation"

    def validate(self) -> None:
        super().validate()
        require(2 <= self.grid_size <= 32, f"grid_size={self.grid_size} must lie in [2, 32]")
        require(2 <= self.min_path_len <= self.n_cells,
                f"min_path_len={self.min_path_len} must lie in [2, {self.n_cells}]")

    @property
    def n_cells(self) -> int:
        return self.grid_size**2

    @property
    def vocab(self) -> tuple[str, ...]:
        labels = ("[PAD]",) if self.answer == "path" else ("[OFF]", "[ON]")
        return (*(f"c{i}" for i in range(self.n_cells)), "[SEP]", *labels, "[MASK]")

    @property
    def answer_start(self) -> int:
        return 2 * (self.n_cells - 1) + 4

    @property
    def seq_len(self) -> int:
        return self.answer_start + self.n_cells

    def settings(self) -> dict:
        return {"grid_size": self.grid_size, "min_path_len": self.min_path_len, "answer": self.answer}

    def _examples(self, mazes: list[Maze]) -> Examples:
        sep = self.vocab.index("[SEP]")
        blank = self.vocab.index("[PAD]" if self.answer == "path" else "[OFF]")
        tokens = np.full((len(mazes), self.seq_len), blank, dtype=np.int64)
        for row, maze in zip(tokens, mazes):
            edges = np.asarray(maze.edges, dtype=np.int64).reshape(-1)
            row[: len(edges)] = edges
            row[len(edges) : self.answer_start] = (sep, maze.start, maze.goal, sep)
            if self.answer == "path":
                row[self.answer_start : self.answer_start + len(maze.path)] = maze.path
            else:
                row[self.answer_start + np.asarray(maze.path)] = self.vocab.index("[ON]")
        answer_mask = np.zeros_like(tokens, dtype=bool)
        answer_mask[:, self.answer_start :] = True
        keys = np.array([canonical_key(m) for m in mazes], dtype="S20")
        return Examples(tokens, answer_mask, keys)

    def generate(self, count: int, seed: int) -> Examples:
        return self._examples(generate_mazes(count, self.grid_size, seed, self.min_path_len,
                                             progress=count >= 10_000, workers=self.workers))

    def read_file(self, path: Path) -> Examples:
        """JSON lines: {"edges": [[a, b], ...], "start": s, "goal": g}, cells numbered row * n + col."""
        mazes = []
        lines = path.read_text().splitlines()
        for number, line in enumerate(progress_bar(lines, desc="reading mazes", disable=len(lines) < 10_000), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
                edges = tuple((_cell(a), _cell(b)) for a, b in record["edges"])
                start, goal = _cell(record["start"]), _cell(record["goal"])
                if start == goal:
                    raise ValueError(f"start and goal are the same cell ({start})")
                path_cells = maze_path(self.grid_size, edges, start, goal)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise DataFormatError(f"{where}: not a valid {self.grid_size}x{self.grid_size} maze: {error}") from None
            mazes.append(Maze(self.grid_size, edges, start, goal, tuple(path_cells)))
        if not mazes:
            raise DataFormatError(f"{path}: no mazes found")
        return self._examples(mazes)

    def augment(self, tokens: torch.Tensor, answer_mask: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        moved = random_maze_symmetries(tokens, self.grid_size, self.answer_start, self.answer == "cells", generator)
        return moved, answer_mask  # the answer region stays where it is

    def score(self, predicted: torch.Tensor, target: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """Exact match on the answer region: in a tree the start->goal path (and its cell set) is unique."""
        return ((predicted == target) | ~answer_mask).all(1)


def _cell(value: object) -> int:
    """A cell number as the file must give it: a JSON integer (not 2.7, "10" or true, which would be coerced)."""
    if type(value) is not int:
        raise ValueError(f"cell {json.dumps(value)[:40]} is not an integer")
    return value

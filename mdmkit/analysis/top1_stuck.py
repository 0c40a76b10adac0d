"""The grids a Sudoku model gets stuck on along its own full-step (Top-1) path, and whether its guess there is right.

A puzzle beyond singles makes a solver guess wherever no naked or hidden single is left. `sudoku_logic.stuck_grids`
follows one logical path (each guess the cell with the fewest candidates); the model follows its own, revealing its
most confident cell each step, and the grids it reaches are the ones its accuracy depends on. On the paper model
the two differ: its most confident cell is right on 99.5% of the logical path's grids past the closure, its reveal
on 93.7% of the stuck grids of its own path (docs/results/sudoku_paper_stuck_grids.md). Those grids, harvested from
training puzzles, are data for training on the states the model itself visits (`data.stuck_file`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from mdmkit.analysis.reveals import predictive
from mdmkit.tasks.sudoku import CELL_POSITIONS, serialize
from mdmkit.tasks.sudoku_logic import grade_puzzle


@dataclass(frozen=True)
class StuckOnPath:
    """Every grid stuck for singles that Top-1 revealed from, every revealed cell in it right: `grids` [N, 81]
    (0 = blank), `puzzle` [N] the index of the puzzle it came from, `right` [N] whether the reveal made from it
    was right (a wrong one ends that puzzle's path)."""

    grids: np.ndarray
    puzzle: np.ndarray
    right: np.ndarray

    def __len__(self) -> int:
        return len(self.grids)


def top1_stuck_grids(network: torch.nn.Module, mask_id: int, puzzles: np.ndarray, solutions: np.ndarray,
                     batch_size: int = 250, progress: bool = False) -> StuckOnPath:
    """Run Top-1 confidence decoding (`TopKSampler(k=1)`'s choice: the masked cell whose most likely digit is most
    likely, the first such) on `puzzles` [P, 81] and keep the grids stuck for singles it reveals from. A path ends
    at its first wrong reveal or once singles alone would finish the grid: past that, no grid on a right path is
    stuck, so the forwards are saved."""
    device = next(network.parameters(), torch.empty(0)).device  # a parameter-free toy runs on the CPU
    cells = torch.from_numpy(CELL_POSITIONS).to(device)
    grids, origin, right = [], [], []
    network.eval()
    for begin in tqdm(range(0, len(puzzles), batch_size), desc="top-1 paths", unit="batch", disable=not progress):
        state = puzzles[begin:begin + batch_size].copy()
        answers = torch.from_numpy(serialize(solutions[begin:begin + batch_size])).to(device)
        rows = np.arange(len(state))
        while len(rows):
            grades = [grade_puzzle(grid) for grid in state[rows]]
            unsolved = np.array([grade.left_by_singles > 0 for grade in grades])
            stuck = np.array([grade.blanks == grade.left_by_singles for grade in grades])[unsolved]
            rows = rows[unsolved]
            if not len(rows):
                break
            blank = torch.from_numpy(state[rows] == 0).to(device)
            tokens = answers[rows].clone()
            tokens[:, cells] = tokens[:, cells].masked_fill(blank, mask_id)
            with torch.no_grad():
                probs = predictive(network(tokens)[:, cells], mask_id)
            confidence, digit = probs.max(-1)
            cell = (1.0 - confidence).masked_fill(~blank, float("inf")).argmin(1)
            picked = digit.gather(1, cell[:, None]).squeeze(1).cpu().numpy() + 1  # token id -> digit
            cell = cell.cpu().numpy()
            good = picked == solutions[begin + rows, cell]
            grids.append(state[rows][stuck])
            origin.append(begin + rows[stuck])
            right.append(good[stuck])
            state[rows[good], cell[good]] = picked[good]
            rows = rows[good]
    if not grids:
        return StuckOnPath(np.zeros((0, 81), np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
    return StuckOnPath(np.concatenate(grids).astype(np.int64), np.concatenate(origin), np.concatenate(right))

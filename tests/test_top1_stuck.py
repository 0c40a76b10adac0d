"""mdmkit.analysis.top1_stuck: the stuck grids of a model's own Top-1 path, checked against a toy whose path is
known exactly (the logical path of `sudoku_logic.stuck_grids`, or a wrong first guess) and against the sampler's
own trajectory on the CPU model."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from conftest import ROOT

from mdmkit.analysis.reveals import TracingCounter
from mdmkit.analysis.top1_stuck import top1_stuck_grids
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import TopKSampler
from mdmkit.tasks.sudoku import CELL_POSITIONS, puzzles_and_solutions
from mdmkit.tasks.sudoku_generator import generate_puzzles
from mdmkit.tasks.sudoku_logic import BEYOND, _candidates, _hidden_singles, grade_puzzle, stuck_grids

MASK = 10


class LogicalSolver(torch.nn.Module):
    """Knows the solutions; each blank cell predicts its solution digit (or, with `wrong_guesses`, another digit
    where singles do not decide it), more confidently the fewer candidates the cell has once singles are played:
    its Top-1 path is the logical one, each guess in the first cell with the fewest candidates."""

    def __init__(self, solutions: np.ndarray, wrong_guesses: bool = False) -> None:
        super().__init__()
        self.solutions, self.wrong_guesses = solutions, wrong_guesses

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.full((*tokens.shape, MASK + 1), -100.0)
        for row, sequence in enumerate(tokens.numpy()):
            cells = sequence[CELL_POSITIONS]
            grid = np.where(cells == MASK, 0, cells + 1)
            (solution,) = [s for s in self.solutions if np.array_equal(s[grid > 0], grid[grid > 0])]
            cand = _candidates(grid.tolist())
            _hidden_singles(cand)
            for cell in np.flatnonzero(grid == 0):
                count = cand[cell].bit_count()
                digit = solution[cell] % 9 + 1 if self.wrong_guesses and count > 1 else solution[cell]
                logits[row, CELL_POSITIONS[cell], :9] = 0.0
                # fewer candidates: more confident; among as many, the first cell (no tie left to float rounding)
                logits[row, CELL_POSITIONS[cell], digit - 1] = 10.0 - count - 1e-3 * cell
        return logits


def beyond_singles(count: int) -> tuple[np.ndarray, np.ndarray]:
    puzzles, solutions = generate_puzzles(count, 24, seed=5)
    beyond = [i for i, p in enumerate(puzzles) if grade_puzzle(p).grade == BEYOND]
    assert len(beyond) >= 3
    return puzzles, solutions


def test_a_logical_solver_meets_the_logical_paths_grids() -> None:
    puzzles, solutions = beyond_singles(12)
    found = top1_stuck_grids(LogicalSolver(solutions), MASK, puzzles, solutions, batch_size=5)
    expected = [(grid, i) for i in range(len(puzzles)) for grid in stuck_grids(puzzles[i], solutions[i])]
    assert len(found) == len(expected) and found.right.all()
    order = np.lexsort((np.arange(len(found)), found.puzzle))  # batches interleave puzzles' grids by step
    assert found.puzzle[order].tolist() == [i for _, i in expected]
    assert np.array_equal(found.grids[order], np.array([grid for grid, _ in expected]))


def test_a_wrong_guess_ends_the_path_at_the_closure() -> None:
    puzzles, solutions = beyond_singles(12)
    found = top1_stuck_grids(LogicalSolver(solutions, wrong_guesses=True), MASK, puzzles, solutions, batch_size=4)
    expected = [i for i in range(len(puzzles)) if stuck_grids(puzzles[i], solutions[i])]
    assert sorted(found.puzzle.tolist()) == expected and not found.right.any()
    for grid, i in zip(found.grids, found.puzzle):
        assert np.array_equal(grid, stuck_grids(puzzles[i], solutions[i], most=1)[0])


def test_the_cpu_models_path_is_the_samplers() -> None:
    trained = TrainedModel(str(ROOT / "checkpoints" / "sudoku_mdm.pt"))
    test = trained.task.load_test().head(80)
    puzzles, solutions = puzzles_and_solutions(test.tokens.numpy(), test.answer_mask.numpy())
    beyond = [i for i, p in enumerate(puzzles) if grade_puzzle(p).grade == BEYOND][:6]
    network = trained.network()
    found = top1_stuck_grids(network, MASK, puzzles[beyond], solutions[beyond], batch_size=1)
    expected = []
    for k, i in enumerate(beyond):  # one row a batch on both sides: the same forwards to the bit
        counter = TracingCounter(network, 1, MASK)
        with torch.no_grad():
            final = TopKSampler(k=1).sample(counter, test.tokens[i:i + 1].masked_fill(test.answer_mask[i:i + 1], MASK),
                                            MASK).tokens
        states = [forward.tokens[0] for forward in counter.trace] + [final[0]]
        for before, after in itertools.pairwise(states):
            grid = torch.where(before[CELL_POSITIONS] == MASK, 0, before[CELL_POSITIONS] + 1).numpy()
            grade = grade_puzzle(grid)
            if grade.left_by_singles == 0:
                break
            right = bool((after == test.tokens[i])[after != MASK].all())
            if grade.left_by_singles == grade.blanks:
                expected.append((grid, k, right))
            if not right:
                break
    assert len(expected) > len(beyond)  # paths past their first stuck grid
    assert found.puzzle.tolist() == [k for _, k, _ in expected]
    assert found.right.tolist() == [right for _, _, right in expected]
    assert np.array_equal(found.grids, np.array([grid for grid, _, _ in expected]))

"""The grids where singles run out, against the grids training shows: one forward of a Sudoku model on each.

Training masks a random share of a puzzle's blanks (givens stay); sampling meets, on a puzzle beyond singles, the
grid where no naked or hidden single is left (its singles closure, where every failure of the paper model starts:
docs/results/sudoku_paper_errors.md). For each such test puzzle this script builds both at the same number of
blanks, the closure and a random draw of that many of the puzzle's blanks, and reads the model's predictions on
their masked cells in one forward: accuracy of each cell's most likely digit, mean entropy, and whether the single
most confident cell (Top-1's next reveal) is right; and how often a random draw is itself stuck for singles.
Two more rows read the grids a solve gets stuck on again past a right guess: on the logical path
(`sudoku_logic.stuck_grids`, what `data.stuck_grids=all` trains on), and on the model's own Top-1 path
(`mdmkit.analysis.top1_stuck`, what a harvested `data.stuck_file` holds), where its failures are.

    python scripts/sudoku_stuck_grids.py checkpoints/sudoku_paper.pt --out docs/results/sudoku_paper_stuck_grids
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp
from mdmkit.analysis.reveals import predictive
from mdmkit.analysis.top1_stuck import top1_stuck_grids
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers.ordering import entropy
from mdmkit.tasks.sudoku import CELL_POSITIONS, puzzles_and_solutions, serialize
from mdmkit.tasks.sudoku_logic import BEYOND, grade_puzzle, stuck_grids


def compare(checkpoint: str, limit: int | None, seed: int, batch_size: int) -> dict[str, Any]:
    """The kinds of grid side by side on the test puzzles beyond singles (of the first `limit`)."""
    trained = TrainedModel(checkpoint)
    if trained.task.name != "sudoku":
        raise SystemExit(f"{checkpoint} is a {trained.task.name} model: this script reads Sudoku grids")
    test = trained.task.load_test().head(limit)
    puzzles, solutions = puzzles_and_solutions(test.tokens.numpy(), test.answer_mask.numpy())
    beyond = [i for i, puzzle in enumerate(puzzles) if grade_puzzle(puzzle).grade == BEYOND]
    if not beyond:
        raise SystemExit(f"none of the {len(test)} puzzles is beyond singles: raise --limit")
    rng = np.random.default_rng(seed)
    stuck, drawn, later, later_of = [], [], [], []
    for i in beyond:
        closure, *past_guesses = stuck_grids(puzzles[i], solutions[i])
        blanks = np.flatnonzero(puzzles[i] == 0)
        grid = solutions[i].copy()
        grid[rng.choice(blanks, size=np.count_nonzero(closure == 0), replace=False)] = 0
        stuck.append(closure)
        drawn.append(grid)
        later += past_guesses
        later_of += [i] * len(past_guesses)
    network, mask_id = trained.network().eval(), trained.task.mask_id
    drawn_stuck = [grade_puzzle(grid).left_by_singles == np.count_nonzero(grid == 0) for grid in drawn]
    result = {"checkpoint": checkpoint, "n": len(test), "beyond_singles": len(beyond), "seed": seed,
              "singles_closure": _read(network, np.array(stuck), solutions[beyond], mask_id, batch_size),
              "random_draw": {**_read(network, np.array(drawn), solutions[beyond], mask_id, batch_size),
                              "stuck_share": float(np.mean(drawn_stuck))}}
    if later:  # none where every puzzle beyond singles falls to singles after its first right guess
        result["past_a_guess"] = _read(network, np.array(later), solutions[later_of], mask_id, batch_size)
    own = top1_stuck_grids(network, mask_id, puzzles[beyond], solutions[beyond], batch_size, progress=True)
    if len(own):  # none where every path passes its stuck points by revealing cells singles do not decide
        result["own_path"] = {**_read(network, own.grids, solutions[beyond][own.puzzle], mask_id, batch_size),
                              "reveals_right": int(own.right.sum())}
    return result


def _read(network: torch.nn.Module, grids: np.ndarray, solutions: np.ndarray, mask_id: int,
          batch_size: int) -> dict[str, float]:
    """One forward on `grids` [N, 81] (0 = masked): how right and how sure the model is on their masked cells."""
    tokens = torch.from_numpy(serialize(solutions))
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[:, CELL_POSITIONS] = torch.from_numpy(grids == 0)
    hits, entropies, first_right = [], [], []
    with torch.no_grad():
        for begin in range(0, len(tokens), batch_size):
            target, where = tokens[begin:begin + batch_size], masked[begin:begin + batch_size]
            probs = predictive(network(target.masked_fill(where, mask_id)), mask_id)
            right, h = probs.argmax(-1) == target, entropy(probs)
            hits += right[where].tolist()
            entropies += h[where].tolist()
            surest = torch.where(where, h, float("inf")).argmin(1)
            first_right += right.gather(1, surest[:, None]).squeeze(1).tolist()
    return {"grids": len(grids), "blanks_mean": float(np.mean(grids == 0) * 81),
            "cell_accuracy": float(np.mean(hits)), "entropy_mean": float(np.mean(entropies)),
            "surest_cell_accuracy": float(np.mean(first_right))}


def markdown(result: dict[str, Any], command: str, notes: str = "") -> str:
    closure, drawn = result["singles_closure"], result["random_draw"]
    rows = [["singles closure (where Top-1 gets stuck)", *_cells(closure), "100%"],
            ["random draw of as many blanks (what random masking shows)", *_cells(drawn),
             f"{100 * drawn['stuck_share']:.1f}%"]]
    if "past_a_guess" in result:
        rows.append(["stuck again past a right guess (what `data.stuck_grids=all` adds)",
                     *_cells(result["past_a_guess"]), "100%"])
    if "own_path" in result:
        own = result["own_path"]
        what = f"stuck on the model's own Top-1 path (its reveal there right: {own['reveals_right']} of {own['grids']})"
        rows.append([what, *_cells(own), "100%"])
    return "\n".join([
        "# Where singles run out, against what training shows", "",
        (f"`{Path(result['checkpoint']).name}`, the {result['beyond_singles']} of its first {result['n']} test "
         f"puzzles that naked and hidden singles cannot finish: each one's closure beside a random draw of as many "
         f"of its blanks, and the grids where a solve of it is stuck for singles, on the logical path past the "
         f"closure and on the model's own path (its closure included where the path reaches it), one forward "
         f"each. Made by `{command}`; "
         "numbers in the JSON beside this page."), "",
        markdown_table(["grid", "grids", "blanks (mean)", "cells whose most likely digit is right",
                        "mean entropy (nats)", "most confident cell right", "stuck for singles"], rows, "lrrrrrr"), "",
        *([notes.strip(), ""] if notes.strip() else []),
    ])


def _cells(read: dict[str, float]) -> list[str]:
    return [str(read["grids"]), f"{read['blanks_mean']:.1f}", f"{100 * read['cell_accuracy']:.1f}%",
            f"{read['entropy_mean']:.3f}",
            f"{100 * read['surest_cell_accuracy']:.1f}%"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--limit", type=positive_int, default=None, help="the first LIMIT test puzzles (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sudoku_stuck_grids"))
    parser.add_argument("--notes", type=Path, help="a markdown file whose text ends the page (what the rows show)")
    args = parser.parse_args()
    result = compare(args.checkpoint, args.limit, args.seed, args.batch_size)
    command = command_line(__file__, sys.argv[1:])
    page = Page(args.out)
    page.file(".json").write_text(json.dumps({"command": command, **stamp(), **result}, indent=1) + "\n")
    text = markdown(result, command, args.notes.read_text() if args.notes else "")
    page.file(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    run_script(main, "sudoku_stuck_grids.py")

"""Harvest the grids a Sudoku model gets stuck on along its own Top-1 paths of training puzzles, as stuck rows.

`data.stuck_grids` trains on the grids where singles run out on a logical path; the model's own path reaches
others, and those are where it fails (docs/results/sudoku_paper_stuck_grids.md: its most confident cell is right
on 99.5% of the logical path's later grids, its reveal on 93.7% of its own path's). This runs the checkpoint's
Top-1 over the first PUZZLES training puzzles that singles cannot finish (`mdmkit.analysis.top1_stuck`) and
writes every such grid it met, with its puzzle's solution, in the task's cache format; `data.stuck_file=OUT`
adds them to the stuck rows of a training run on the same task (checked: each row's solution must be a
training puzzle's). A JSON beside OUT says what made it.

    python scripts/harvest_stuck_grids.py checkpoints/sudoku_paper.pt --puzzles 10000 --out runs/harvest/leg4.npz
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mdmkit.analysis.pages import command_line, positive_int, run_script, stamp
from mdmkit.analysis.top1_stuck import top1_stuck_grids
from mdmkit.core.devices import resolve_device
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.results import file_fingerprint
from mdmkit.tasks.base import Examples
from mdmkit.tasks.sudoku import SudokuTask, puzzles_and_solutions
from mdmkit.tasks.sudoku_logic import BEYOND, grade_puzzle


def harvest(checkpoint: str, puzzles: int, batch_size: int, device: str) -> tuple[SudokuTask, Examples, dict]:
    """The checkpoint's task, the stuck rows and a summary of what made them."""
    trained = TrainedModel(checkpoint)
    if trained.task.name != "sudoku":
        raise SystemExit(f"{checkpoint} is a {trained.task.name} model: this script reads Sudoku paths")
    train = trained.task.load_splits()["train"]
    grids, solutions = puzzles_and_solutions(train.tokens.numpy(), train.answer_mask.numpy())
    beyond, graded = [], 0
    for graded, grid in enumerate(grids, start=1):  # in split order, until enough: grading all 400k takes minutes
        if grade_puzzle(grid).grade == BEYOND:
            beyond.append(graded - 1)
            if len(beyond) == puzzles:
                break
    network = trained.network().to(resolve_device(device))
    started = time.perf_counter()
    found = top1_stuck_grids(network, trained.task.mask_id, grids[beyond], solutions[beyond], batch_size,
                             progress=True)
    rows = trained.task.examples(found.grids, solutions[beyond][found.puzzle])
    summary = {"checkpoint": checkpoint, "checkpoint_sha": file_fingerprint(checkpoint),
               "task_cache": trained.task.cache_path().name, "training_puzzles_graded": graded,
               "beyond_singles": len(beyond), "grids": len(found), "reveals_right": int(found.right.sum()),
               "blanks_mean": float(np.mean(found.grids == 0) * 81) if len(found) else None,
               "seconds": round(time.perf_counter() - started, 1)}
    return trained.task, rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--puzzles", type=positive_int, default=10_000,
                        help="training puzzles beyond singles to run (~4 a second for the paper model on 2 CPU cores)")
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu, cuda, ...")
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write (a .json beside it)")
    args = parser.parse_args()
    if args.out.suffix != ".npz":
        raise SystemExit(f"--out {args.out}: name a .npz file")
    task, rows, summary = harvest(args.checkpoint, args.puzzles, args.batch_size, args.device)
    if not len(rows):
        raise SystemExit(f"no stuck grid on the model's paths of {summary['beyond_singles']} puzzles: nothing written")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **task.pack(rows))
    meta = {"command": command_line(__file__, sys.argv[1:]), **stamp(), **summary}
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{summary['grids']} stuck grids from {summary['beyond_singles']} training puzzles beyond singles "
          f"(the model's reveal right on {summary['reveals_right']}) in {summary['seconds']} s -> {args.out}")


if __name__ == "__main__":
    run_script(main, "harvest_stuck_grids.py")

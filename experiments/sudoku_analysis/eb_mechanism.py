"""Why EB-Sampler loses accuracy on a model: step-0 entropies, and whether the first wrong reveal is EB's free token.

EB reveals the longest ranked prefix S with sum_{i in S} H_i - max_{i in S} H_i <= gamma: the highest-entropy token
of S is "free" (it does not count against gamma). This script traces EB on the test split of a checkpoint and
reports (1) how many masked cells fall under each entropy level at the first step, and (2) for every example EB
gets wrong, the step of its first wrong reveal and whether the free (highest-entropy) token of that step's set is
wrong, and whether it is the only wrong one.

    python -m experiments.sudoku_analysis.eb_mechanism checkpoints/sudoku_mdm.pt --gammas 1e-5 1e-3 0.1 \
        --out docs/results/sudoku_eb_mechanism
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from experiments.sudoku_analysis.reveals import Forward, TracingCounter, first_wrong_reveals
from mdmkit.analysis.pages import command_line, positive_int, run_script, stamp
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import EBSampler

LEVELS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # entropy bins (nats): below each level


def step_zero_levels(trace: list[Forward], mask_id: int) -> torch.Tensor:
    """Per row of the first forward: masked cells with entropy below each of `LEVELS` [rows, len(LEVELS)]."""
    first = trace[0]
    masked = first.tokens == mask_id
    return torch.stack([((first.entropies < level) & masked).sum(1) for level in LEVELS], dim=1)


def trace_eb(trained: TrainedModel, gamma: float, limit: int, batch_size: int) -> dict[str, Any]:
    task, network = trained.task, trained.network().eval()
    test = task.load_test().head(limit)  # the test split alone: a paper-scale train split is never made
    sampler = EBSampler(gamma=gamma, ordering="confidence")
    levels, wrong_rows, correct, nfe = [], [], 0, 0
    for begin in tqdm(range(0, len(test), batch_size), desc=f"gamma={gamma:g}", leave=False):
        target = test.tokens[begin: begin + batch_size]
        answer = test.answer_mask[begin: begin + batch_size]
        counter = TracingCounter(network, target.shape[0], task.mask_id)
        final = sampler.sample(counter, target.masked_fill(answer, task.mask_id), task.mask_id).tokens
        good = task.score(final, target, answer)
        correct += int(good.sum())
        nfe += int(counter.nfe.sum())
        levels.append(step_zero_levels(counter.trace, task.mask_id))
        wrong_rows += first_wrong_reveals(counter.trace, final, target, task.mask_id)
    counts = torch.cat(levels).float()
    n_wrong = len(wrong_rows)
    return {
        "gamma": gamma, "n": len(test), "accuracy": correct / len(test), "nfe_mean": nfe / len(test),
        "step0_cells_below": {f"{level:g}": float(counts[:, i].mean()) for i, level in enumerate(LEVELS)},
        "step0_masked_cells": float(((test.answer_mask).sum(1)).float().mean()),
        "examples_with_a_wrong_cell": n_wrong,
        "first_wrong_step_mean": sum(r.step for r in wrong_rows) / max(1, n_wrong),
        "first_wrong_set_size_mean": sum(int(r.revealed.sum()) for r in wrong_rows) / max(1, n_wrong),
        "free_token_wrong_share": sum(r.free_is_wrong for r in wrong_rows) / max(1, n_wrong),
        "only_free_token_wrong_share": sum(r.free_is_wrong and int(r.wrong.sum()) == 1
                                           for r in wrong_rows) / max(1, n_wrong),
        "first_wrong_step0_share": sum(r.step == 0 for r in wrong_rows) / max(1, n_wrong),
        "first_wrong_free_entropy_mean": sum(r.free_entropy for r in wrong_rows) / max(1, n_wrong),
    }


def markdown(results: list[dict[str, Any]], command: str, checkpoint: str) -> list[str]:
    first = results[0]
    bins = " | ".join(f"H < {level}" for level in first["step0_cells_below"])
    md = ["# EB-Sampler's free token on the Sudoku model", "",
          (f"Reproduce: `{command}` on `{checkpoint}`; data in the JSON beside this page. EB with the confidence "
           "ordering at temperature 0 on the first test puzzles."), "",
          f"## Entropy of the {first['step0_masked_cells']:.1f} masked cells at the first step (mean cells per puzzle)",
          "", f"| {bins} |", "|" + "---:|" * len(first["step0_cells_below"]),
          "| " + " | ".join(f"{v:.1f}" for v in first["step0_cells_below"].values()) + " |", "",
          "## The first wrong reveal of each puzzle EB gets wrong", "",
          ("| gamma | accuracy | NFE | puzzles with a wrong cell | first wrong at step 0 | mean set size there | "
           "free token wrong | only the free token wrong | free token's entropy (nats) |"),
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        md.append(f"| {r['gamma']:g} | {100 * r['accuracy']:.1f}% | {r['nfe_mean']:.1f} | "
                  f"{r['examples_with_a_wrong_cell']} | {100 * r['first_wrong_step0_share']:.0f}% | "
                  f"{r['first_wrong_set_size_mean']:.1f} | {100 * r['free_token_wrong_share']:.0f}% | "
                  f"{100 * r['only_free_token_wrong_share']:.0f}% | {r['first_wrong_free_entropy_mean']:.3f} |")
    return md + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--gammas", type=float, nargs="+", default=[1e-5, 1e-3, 0.1])
    parser.add_argument("--limit", type=positive_int, default=1000)
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sudoku_eb_mechanism"))
    args = parser.parse_args()
    trained = TrainedModel(args.checkpoint)
    with torch.no_grad():
        results = [trace_eb(trained, gamma, args.limit, args.batch_size) for gamma in args.gammas]
    command = command_line(__file__, sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, **stamp(), "checkpoint": args.checkpoint,
                                                         "results": results}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(markdown(results, command, args.checkpoint)))
    print("\n".join(markdown(results, command, args.checkpoint)))


if __name__ == "__main__":
    run_script(main, "eb_mechanism.py")

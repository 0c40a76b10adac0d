"""Where a Sudoku model's remaining errors are: full-step accuracy by givens, by the logic a puzzle needs, and
the grid each failure first went wrong on; checkpoints sampled on the same split are compared puzzle by puzzle.

A test split with a range of givens (the paper's 24-36) mixes easy and hard puzzles; one accuracy hides which
ones a model still fails, and so what more training has to buy. Each checkpoint samples its own test split with
Top-1 (full step, `evaluate.py`'s path, so the overall accuracy is the evaluation's), counted per givens and per
logic grade (`sudoku_logic`: naked singles, hidden singles, or beyond). The failures are then traced
again, alone, to the grid of their first wrong reveal: could singles still fill a cell there, or had the model
to reason past them? Two legs of one model share a split, so which puzzles one solves and the other fails, with
a sign test on those, says more than two accuracies with overlapping intervals.

    python -m experiments.sudoku_analysis.sudoku_errors checkpoints/sudoku_paper.pt \
        --out docs/results/sudoku_paper_errors
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.sudoku_analysis.reveals import TracingCounter, first_wrong_reveals
from experiments.sudoku_analysis.sudoku_logic import GRADES, grade_puzzle
from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp
from mdmkit.analysis.stats import sign_test, wilson_interval
from mdmkit.evaluation.runner import sample_split
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import TopKSampler
from mdmkit.tasks.base import Split
from mdmkit.tasks.sudoku import SudokuTask, puzzles_and_solutions

LEFT_BINS = ((0, 0), (1, 19), (20, 29), (30, 39), (40, 81))  # blank cells left after singles, as plotted


def count_errors(checkpoint: str, ordering: str, limit: int | None, batch_size: int) -> dict[str, Any]:
    """Correct / total per givens, per logic grade and per cells left after singles on the checkpoint's test
    split (its first `limit` puzzles), and the first wrong reveal of each failure."""
    trained = TrainedModel(checkpoint)
    if trained.task.name != "sudoku":
        raise SystemExit(f"{checkpoint} is a {trained.task.name} model: this script counts Sudoku givens")
    test = trained.task.load_test().head(limit)
    sampler = TopKSampler(k=1, ordering=ordering)
    network = trained.network()
    result = sample_split(network, trained.task, test, sampler, batch_size=batch_size, progress=True)
    correct = result.correct.tolist()
    grades = [grade_puzzle(p) for p in puzzles_and_solutions(test.tokens.numpy(), test.answer_mask.numpy())[0]]
    failed = [i for i, good in enumerate(correct) if not good]
    # beside each wrong grid's blanks, its puzzle's singles closure's: fewer at the wrong grid, past a right guess
    first_wrong = [{**found, "puzzle_left_by_singles": grades[found["puzzle"]].left_by_singles}
                   for found in trace_failures(network, trained.task, test, failed, sampler, batch_size)]
    return {"checkpoint": checkpoint, "test_set": test.fingerprint(), "n": len(test), "accuracy": result.accuracy,
            "nfe_mean": float(result.nfe.mean()),
            "by_givens": _grouped([81 - g.blanks for g in grades], correct, sorted),
            "by_logic": _grouped([g.grade for g in grades], correct, lambda seen: [k for k in GRADES if k in seen]),
            "by_left_by_singles": _grouped([_left_bin(g.left_by_singles) for g in grades], correct,
                                           lambda seen: [b for b in map(_bin_name, LEFT_BINS) if b in seen]),
            "failures": len(failed), "failed": failed, "first_wrong": first_wrong}


def trace_failures(network: torch.nn.Module, task: SudokuTask, test: Split, failed: list[int],
                   sampler: TopKSampler, batch_size: int) -> list[dict[str, Any]]:
    """Sample the failed puzzles again, traced, and grade the grid each one first went wrong on (every cell in
    it right): how many blanks it had, how many singles would leave, and how sure the model was of its wrong
    cell. A puzzle that failed in its evaluation batch and not when sampled again here is left out (float
    noise between batch compositions; the page shows how many were traced)."""
    found = []
    network.eval()
    for begin in range(0, len(failed), batch_size):
        index = torch.tensor(failed[begin:begin + batch_size])
        target, answer = test.tokens[index], test.answer_mask[index]
        counter = TracingCounter(network, len(index), task.mask_id)
        with torch.no_grad():
            final = sampler.sample(counter, target.masked_fill(answer, task.mask_id), task.mask_id).tokens
        for reveal in first_wrong_reveals(counter.trace, final, target, task.mask_id):
            before = reveal.before[None]
            grid = grade_puzzle(puzzles_and_solutions(before.numpy(), (before == task.mask_id).numpy())[0][0])
            found.append({"puzzle": failed[begin + reveal.row], "step": reveal.step, "blanks": grid.blanks,
                          "left_by_singles": grid.left_by_singles, "entropy": reveal.free_entropy})
    return found


def _grouped(keys: list, correct: list[bool], order: Callable[[set], list]) -> dict[Any, dict[str, Any]]:
    total = Counter(keys)
    solved = Counter(key for key, good in zip(keys, correct) if good)
    return {key: {"n": total[key], "correct": solved[key], "accuracy": solved[key] / total[key],
                  "ci95": list(wilson_interval(solved[key], total[key]))} for key in order(set(total))}


def puzzle_by_puzzle(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each checkpoint against the first, where both sampled the same split: the puzzles it solves that the
    first failed, those it fails that the first solved, those both fail, and the sign test on the first two."""
    first = models[0]
    before = set(first["failed"])
    rows = []
    for model in models[1:]:
        if model["test_set"] != first["test_set"]:
            continue
        now = set(model["failed"])
        gained, lost = len(before - now), len(now - before)
        rows.append({"checkpoint": model["checkpoint"], "against": first["checkpoint"], "gained": gained,
                     "lost": lost, "both_failed": len(before & now), "sign_test_p": sign_test(gained, lost)})
    return rows


def _bin_name(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}+" if high == 81 else f"{low}-{high}"


def _left_bin(left: int) -> str:
    return next(_bin_name(b) for b in LEFT_BINS if b[0] <= left <= b[1])


def plot(models: list[dict[str, Any]], path: Path) -> None:
    fig, (by_givens, by_left) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for model in models:
        label = f"{Path(model['checkpoint']).stem} ({100 * model['accuracy']:.1f}% overall)"
        _errorbars(by_givens, model["by_givens"], label)
        _errorbars(by_left, model["by_left_by_singles"], label)
    by_givens.set_xlabel("givens")
    by_givens.set_ylabel("full-step accuracy (%), 95% interval")
    by_left.set_xlabel("blank cells left after naked + hidden singles (0: singles solve it)")
    for ax in (by_givens, by_left):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _errorbars(ax: Any, rows: dict[Any, dict[str, Any]], label: str) -> None:
    acc = [100 * r["accuracy"] for r in rows.values()]
    # clamped: an interval's end can round to a hair inside its point (100% against 0.99999...)
    low = [max(0.0, a - 100 * r["ci95"][0]) for a, r in zip(acc, rows.values())]
    high = [max(0.0, 100 * r["ci95"][1] - a) for a, r in zip(acc, rows.values())]
    ax.errorbar([str(key) for key in rows], acc, yerr=[low, high], marker="o", capsize=3, label=label)


def markdown(models: list[dict[str, Any]], command: str, figure: str, notes: str = "") -> str:
    names = [f"`{Path(m['checkpoint']).name}`" for m in models]
    overall = ["all", *(f"**{100 * m['accuracy']:.1f}%** ({m['n']})" for m in models)]
    return "\n".join([
        "# Where the Sudoku models' errors are: givens, logic, first wrong reveal", "",
        (f"Top-1 with the `{models[0]['ordering']}` ordering, EMA weights, each checkpoint on its own test "
         f"split. Made by `{command}`; numbers in the JSON beside this page."), "",
        f"![accuracy by givens and by cells left after singles]({figure})", "",
        "## By givens", "", _table("givens", models, "by_givens", names, overall), "",
        "## By the logic a puzzle needs", "",
        ("The simplest rules that solve the puzzle: repeated *naked singles* (a cell with one candidate left), "
         "also *hidden singles* (a digit with one place left in a row, column or box), or neither (pairs, "
         "chains or a guess)."), "",
        _table("solved by", models, "by_logic", names, overall), "",
        _table("cells left after singles", models, "by_left_by_singles", names, overall), "",
        "## The grid each failure first went wrong on", "",
        ("Each failed puzzle sampled again alone, traced to its first wrong reveal: the grid the model saw there "
         "(every filled cell right), and whether naked + hidden singles could still fill any of its blanks."), "",
        markdown_table(["checkpoint", "failures traced", "singles could still fill a cell",
                        "stuck for singles", "of those, past a right guess", "mean step",
                        "mean entropy of the wrong cell (nats)"],
                       [_first_wrong_row(name, m) for name, m in zip(names, models)], "lrrrrrr"), "",
        ("*Past a right guess*: the wrong grid has fewer blanks than the puzzle's own singles closure, i.e. the "
         "model had already got past the first grid where singles run out)."), "",
        *_paired_section(puzzle_by_puzzle(models)),
        *([notes.strip(), ""] if notes.strip() else []),
    ])


def _paired_section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    return ["## Puzzle by puzzle", "",
            ("Each checkpoint against the first on the same test puzzles. The sign test's p: the chance of a "
             "split at least this uneven between the two columns of changed puzzles, were both models equally "
             "good."), "",
            markdown_table(["checkpoint", "against", "solved, failed before", "failed, solved before",
                            "failed by both", "sign test p"],
                           [[f"`{Path(r['checkpoint']).name}`", f"`{Path(r['against']).name}`", r["gained"],
                             r["lost"], r["both_failed"], f"{r['sign_test_p']:.3g}"] for r in rows], "llrrrr"), ""]


def _table(what: str, models: list[dict[str, Any]], field: str, names: list[str], overall: list[str]) -> str:
    keys = list(dict.fromkeys(key for m in models for key in m[field]))
    rows = [[key, *(_cell(m[field].get(key)) for m in models)] for key in keys]
    return markdown_table([what, *names], [*rows, overall], "r" * (len(names) + 1))


def _first_wrong_row(name: str, model: dict[str, Any]) -> list[Any]:
    found = model["first_wrong"]
    stuck = [f for f in found if f["left_by_singles"] == f["blanks"]]
    past = sum(f["blanks"] < f["puzzle_left_by_singles"] for f in stuck)
    return [name, f"{len(found)} of {model['failures']}", len(found) - len(stuck), len(stuck), past,
            _mean([f["step"] for f in found]), _mean([f["entropy"] for f in found], 3)]


def _mean(values: list[float], digits: int = 1) -> str:
    return f"{sum(values) / len(values):.{digits}f}" if values else "—"


def _cell(row: dict[str, Any] | None) -> str:
    return "" if row is None else f"{100 * row['accuracy']:.1f}% ({row['correct']}/{row['n']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--ordering", default="confidence",
                        help="the Top-1 ordering (confidence, entropy, margin)")
    parser.add_argument("--limit", type=positive_int, default=None, help="the first LIMIT test puzzles (default: all)")
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sudoku_errors"))
    parser.add_argument("--notes", type=Path,
                        help="a markdown file whose text ends the page (what the rows show)")
    args = parser.parse_args()
    models = [{**count_errors(c, args.ordering, args.limit, args.batch_size), "ordering": args.ordering}
              for c in args.checkpoints]
    command = command_line(__file__, sys.argv[1:])
    page = Page(args.out)
    record = {"command": command, **stamp(), "models": models}
    page.file(".json").write_text(json.dumps(record, indent=1) + "\n")
    plot(models, page.file(".png"))
    text = markdown(models, command, page.file(".png").name, args.notes.read_text() if args.notes else "")
    page.file(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    run_script(main, "sudoku_errors.py")

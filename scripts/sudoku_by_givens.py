"""Full-step accuracy of Sudoku checkpoints by the number of givens: where a model's remaining errors are.

A test split with a range of givens (the paper's 24-36) mixes easy and hard puzzles; one accuracy hides which
ones a model still fails, and so what more training has to buy. Each checkpoint samples its own test split
with Top-1 (full step, `evaluate.py`'s path, so the overall accuracy is the evaluation's), counted per givens.

    python scripts/sudoku_by_givens.py checkpoints/sudoku_paper.pt --out docs/results/sudoku_paper_by_givens
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp
from mdmkit.evaluation.runner import sample_split
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.results import wilson_interval
from mdmkit.samplers import TopKSampler


def by_givens(checkpoint: str, ordering: str, limit: int | None, batch_size: int) -> dict[str, Any]:
    """Correct / total per number of givens on the checkpoint's test split (its first `limit` puzzles)."""
    trained = TrainedModel(checkpoint)
    if trained.task.name != "sudoku":
        raise SystemExit(f"{checkpoint} is a {trained.task.name} model: this script counts Sudoku givens")
    test = trained.task.load_test().head(limit)
    result = sample_split(trained.network(), trained.task, test, TopKSampler(k=1, ordering=ordering),
                          batch_size=batch_size, progress=True)
    givens = (81 - test.answer_mask.sum(1)).tolist()  # the answer positions are the blank cells
    total = Counter(givens)
    solved = Counter(g for g, good in zip(givens, result.correct.tolist()) if good)
    rows = {g: {"n": total[g], "correct": solved[g], "accuracy": solved[g] / total[g],
                "ci95": list(wilson_interval(solved[g], total[g]))} for g in sorted(total)}
    return {"checkpoint": checkpoint, "n": len(test), "accuracy": result.accuracy,
            "nfe_mean": float(result.nfe.mean()), "by_givens": rows}


def plot(models: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for model in models:
        rows = model["by_givens"]
        acc = [100 * r["accuracy"] for r in rows.values()]
        # clamped: an interval's end can round to a hair inside its point (100% against 0.99999...)
        low = [max(0.0, a - 100 * r["ci95"][0]) for a, r in zip(acc, rows.values())]
        high = [max(0.0, 100 * r["ci95"][1] - a) for a, r in zip(acc, rows.values())]
        ax.errorbar(list(rows), acc, yerr=[low, high], marker="o", capsize=3,
                    label=f"{Path(model['checkpoint']).stem} ({100 * model['accuracy']:.1f}% overall)")
    ax.set_xlabel("givens")
    ax.set_ylabel("full-step accuracy (%), 95% interval")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(models: list[dict[str, Any]], command: str, figure: str, notes: str = "") -> str:
    givens = sorted({g for m in models for g in m["by_givens"]})
    header = ["givens", *(f"`{Path(m['checkpoint']).name}`" for m in models)]
    rows = [[g, *(_cell(m["by_givens"].get(g)) for m in models)] for g in givens]
    rows.append(["all", *(f"**{100 * m['accuracy']:.1f}%** ({m['n']})" for m in models)])
    return "\n".join([
        "# Full-step accuracy by the number of givens", "",
        (f"Top-1 with the `{models[0]['ordering']}` ordering, EMA weights, each checkpoint on its own test "
         f"split. Made by `{command}`; numbers in the JSON beside this page."), "",
        f"![accuracy by givens]({figure})", "", markdown_table(header, rows, "r" * len(header)), "",
        *([notes.strip(), ""] if notes.strip() else []),
    ])


def _cell(row: dict[str, Any] | None) -> str:
    return "" if row is None else f"{100 * row['accuracy']:.1f}% ({row['correct']}/{row['n']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--ordering", default="confidence",
                        help="the Top-1 ordering (confidence, entropy, margin)")
    parser.add_argument("--limit", type=positive_int, default=None, help="the first LIMIT test puzzles (default: all)")
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sudoku_by_givens"))
    parser.add_argument("--notes", type=Path,
                        help="a markdown file whose text ends the page (what the rows show)")
    args = parser.parse_args()
    models = [{**by_givens(c, args.ordering, args.limit, args.batch_size), "ordering": args.ordering}
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
    run_script(main, "sudoku_by_givens.py")

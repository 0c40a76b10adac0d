"""Every decoding rule on one reference model: fronts, AUP and the lowest NFE keeping 98% of full-step accuracy.

    python scripts/rules_page.py docs/results/rules_sudoku.jsonl --out docs/results/rules_sudoku

The rows come from `evaluate.py sweep=rules_<task>` (conf/sweep/rules_*.yaml). Families are ranked twice: by AUP
(mdmkit.analysis.aup: area under accuracy vs tokens per forward, d3LLM) and by the lowest NFE whose accuracy keeps
98% of full-step accuracy (Top-1 confidence, `topk-confidence` with k=1). The oracle floor is the distance to the
best any order could do on the full-step trajectory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mdmkit.analysis import pareto
from mdmkit.analysis.aup import family_aup
from mdmkit.analysis.pages import Page, command_line, markdown_table, run_script, stamp
from mdmkit.analysis.pareto_plot import plot_fronts
from mdmkit.io.naming import ORACLE, derive_family, sampler_settings

FULL_STEP = "topk-confidence"


def full_step_accuracy(rows: list[dict]) -> float:
    """Accuracy of Top-1 confidence (one token per forward), the reference the 98% is taken of."""
    ones = [r for r in rows if derive_family(r) == FULL_STEP and r["sampler"].get("k") == 1
            and r.get("kind") == "evaluate"]
    if not ones:
        sys.exit(f"error: no {FULL_STEP} k=1 row: the full-step reference is missing")
    return float(ones[0]["accuracy"])


def family_table(rows: list[dict], reference: float) -> list[dict]:
    """One entry per family: AUP, best accuracy, the lowest NFE keeping 98% (and its setting), the NFE range."""
    aups = family_aup(rows, derive_family)
    lowest = pareto.lowest_nfe_keeping_by_family(rows, reference)
    entries = []
    for family in pareto.families(rows):
        own = [r for r in rows if derive_family(r) == family]
        keep = lowest.get(family)
        entries.append({
            "family": family, "runs": len(own), "aup": aups.get(family),
            "best_accuracy": max(float(r["accuracy"]) for r in own),
            "nfe_min": min(float(r["nfe_mean"]) for r in own), "nfe_max": max(float(r["nfe_mean"]) for r in own),
            "lowest_nfe_98": None if keep is None else keep.nfe,
            "lowest_nfe_98_accuracy": None if keep is None else keep.accuracy,
            "lowest_nfe_98_setting": (None if keep is None
                                      else sampler_settings((keep.payload or {}).get("sampler"))),
        })
    return entries


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(task: str, entries: list[dict], reference: float, command: str, source: str, n: int,
             limit: int | None, figure: str) -> list[str]:
    by_aup = sorted((e for e in entries if e["aup"] is not None), key=lambda e: -e["aup"])
    by_nfe = sorted(entries, key=lambda e: (e["lowest_nfe_98"] is None, e["lowest_nfe_98"] or 0.0))
    oracle = next((e for e in entries if e["family"] == ORACLE), None)
    md = [f"# Every decoding rule on the {task} reference model", "",
          (f"Reproduce: `{command}` from the rows in `{source}` ({n} rows; `python evaluate.py "
           f"ckpt=checkpoints/{task}_mdm.pt sweep=rules_{task}{f' limit={limit}' if limit else ''} "
           f"results_file={source}`; {f'the first {limit} test examples' if limit else 'the whole test split'}). "
           "Full-step accuracy (Top-1 confidence): "
           f"{100 * reference:.1f}%; 98% of it: {98 * reference:.1f}%."), "",
          f"![accuracy vs NFE]({figure})", "",
          "## Ranked by AUP", "",
          ("AUP: area under accuracy (%) vs tokens per forward, each point weighted by "
           "min(exp(-3 (1 - y / y_max)), 1), points more than 5 points below the family's lowest-parallelism "
           "accuracy left out (d3LLM; "
           "`mdmkit/analysis/aup.py`). y_max is the best accuracy on this page."), "",
          markdown_table(["rank", "family", "AUP", "best accuracy", "NFE range", "runs"],
                         [[i + 1, e["family"], f"{e['aup']:.1f}", f"{100 * e['best_accuracy']:.1f}%",
                           f"{e['nfe_min']:.1f}-{e['nfe_max']:.1f}", e["runs"]] for i, e in enumerate(by_aup)]),
          "", "## Ranked by the lowest NFE keeping 98% of full-step accuracy", "",
          markdown_table(["rank", "family", "lowest NFE ≥ 98%", "its accuracy", "setting", "× fewer than full step"],
                         [[i + 1, e["family"], _fmt(e["lowest_nfe_98"], ".2f"),
                           "—" if e["lowest_nfe_98_accuracy"] is None else f"{100 * e['lowest_nfe_98_accuracy']:.1f}%",
                           e["lowest_nfe_98_setting"] or "—",
                           _ratio(entries, e)] for i, e in enumerate(by_nfe)]), ""]
    if oracle is not None and oracle["lowest_nfe_98"] is not None:
        md += [(f"The oracle floor of the full-step trajectory is {oracle['nfe_min']:.2f} NFE at "
                f"{100 * oracle['best_accuracy']:.1f}%. Families that never reach 98% of full-step accuracy "
                "show —."), ""]
    return md


def _ratio(entries: list[dict], entry: dict) -> str:
    full = next((e for e in entries if e["family"] == FULL_STEP), None)
    if entry["lowest_nfe_98"] is None or full is None or full["nfe_max"] is None:
        return "—"
    return f"{full['nfe_max'] / entry['lowest_nfe_98']:.2f}×"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output prefix: <out>.md/.json/.png")
    parser.add_argument("--notes", type=Path, help="markdown appended under 'What we see'")
    args = parser.parse_args(argv)
    rows = pareto.sort_rows(pareto.load_rows([args.results]))
    if not rows:
        sys.exit(f"error: no rows in {args.results}")
    tasks, models = sorted({str(r.get("task")) for r in rows}), pareto.checkpoints(rows)
    differences = pareto.test_set_differences(rows)
    if len(tasks) > 1 or len(models) > 1 or differences:  # one model's rules on one test set, or no ranking
        sys.exit(f"error: {args.results} holds rows of {len(tasks)} task(s) and {len(models)} checkpoint(s)"
                 f"{' on different test sets (' + '; '.join(differences) + ')' if differences else ''}: "
                 "give the rows of one checkpoint on one test set")
    task = rows[0]["task"]
    reference = full_step_accuracy(rows)
    entries = family_table(rows, reference)
    page, command = Page(args.out), command_line(__file__, argv)
    plot_fronts(rows, page.file(".png"), title=f"{task}: every decoding rule, accuracy vs NFE",
                baseline_family=FULL_STEP)
    md = markdown(task, entries, reference, command, str(args.results), len(rows), rows[0].get("limit"),
                  page.file(".png").name)
    if args.notes:
        md += ["## What we see", "", args.notes.read_text().strip(), ""]
    page.write(markdown=md, data={"command": command, **stamp(), "task": task, "full_step_accuracy": reference,
                                  "families": entries})
    print("\n".join(md))


if __name__ == "__main__":
    run_script(main, "rules_page.py")

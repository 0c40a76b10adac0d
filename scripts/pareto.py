"""Accuracy-vs-NFE Pareto fronts of the samplers evaluated on one task: a plot, a markdown page, the rows used.

    python scripts/pareto.py results/evaluations.jsonl multirun/ --task sudoku \
        --out docs/results/sudoku_pareto --baseline topk-confidence

RESULTS are JSONL files and/or directories (every *.jsonl below them). Writes <out>.png (fronts per family, the
overall front, the oracle floor), <out>.md (summary table, speedups over the baseline, the command) and
<out>.jsonl (the de-duplicated rows used, sorted), and prints the summary table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from mdmkit.evaluation import pareto

KEEP_LEVELS = (0.90, 0.95, 0.99, 1.0)  # speedups at these fractions of the reference accuracy, plus --keep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSONL results files or directories holding them")
    parser.add_argument("--out", required=True, help="output prefix: writes <out>.png, <out>.md, <out>.jsonl")
    parser.add_argument("--task", required=True, help="task name, e.g. sudoku")
    parser.add_argument("--checkpoint", help="checkpoint sha (or a >= 7 character prefix), path or file name")
    parser.add_argument("--baseline", help="family to compare against, e.g. topk-confidence")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--log-nfe", dest="log_nfe", action="store_true", default=True, help="log NFE axis (default)")
    scale.add_argument("--linear-nfe", dest="log_nfe", action="store_false", help="linear NFE axis")
    parser.add_argument("--keep", type=float, default=0.98,
                        help="fraction of the reference accuracy a run must keep (default 0.98)")
    parser.add_argument("--reference-accuracy", type=float,
                        help="reference accuracy (default: best accuracy of --baseline, else of all runs)")
    parser.add_argument("--title", help="plot title")
    parser.add_argument("--cost", action="store_true",
                        help="x axis = cost (NFE + fractional passes such as a planner or an indicator)")
    parser.add_argument("--notes", type=Path, help="markdown file inserted after the summary (analysis, commands)")
    args = parser.parse_args(argv)
    if not 0 < args.keep <= 1:
        parser.error(f"--keep {args.keep} must be in (0, 1]")
    return args


def speedup_levels(reference: float, keep: float) -> list[float]:
    return sorted({round(fraction * reference, 6) for fraction in (*KEEP_LEVELS, keep)})


def run(args: argparse.Namespace, command: str) -> str:
    rows = pareto.load_rows(args.results)
    if not rows:
        raise ValueError(f"no evaluate or oracle rows in {' '.join(args.results)}")
    selected = pareto.select_rows(rows, task=args.task, checkpoint=args.checkpoint)
    if not selected:
        tasks = sorted({str(r.get("task")) for r in rows})
        where = f" and checkpoint {args.checkpoint}" if args.checkpoint else ""
        raise ValueError(f"no rows for task {args.task}{where} (tasks found: {', '.join(tasks)})")
    if args.cost:  # every later step reads nfe_mean: make it the full cost
        selected = [{**r, "nfe_mean": r.get("cost_mean", r["nfe_mean"])} for r in selected]
    found = pareto.checkpoints(selected)
    if len(found) > 1:
        raise ValueError(f"rows of task {args.task} come from {len(found)} checkpoints ({', '.join(found)}): "
                         "pick one with --checkpoint")
    families = pareto.families(selected)
    if args.baseline and args.baseline not in families:
        raise ValueError(f"baseline family {args.baseline} has no rows (families: {', '.join(families)})")
    if not pareto.overall_front(selected):
        raise ValueError(f"no evaluate rows with accuracy and nfe_mean for task {args.task}")

    reference = args.reference_accuracy
    if reference is None:
        reference = pareto.reference_accuracy_of(selected, args.baseline)
        if reference is None:
            reference = pareto.reference_accuracy_of(selected)
    checkpoint = found[0]
    title = args.title or f"{args.task}: accuracy vs NFE ({Path(checkpoint).name or checkpoint})"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = pareto.plot_fronts(selected, out.with_name(out.name + ".png"), title, log_nfe=args.log_nfe,
                             baseline_family=args.baseline)
    table = pareto.summary_table(selected, reference_accuracy=reference, keep=args.keep)

    reference_source = ("given" if args.reference_accuracy is not None
                        else f"best accuracy of {args.baseline}" if args.baseline else "best accuracy of all runs")
    page = [f"# {title}", "", f"![accuracy vs NFE]({png.name})", "",
            (f"Task `{args.task}`, checkpoint `{checkpoint}`; {len(selected)} rows "
             f"({sum(r.get('kind') == pareto.ORACLE for r in selected)} oracle floor). "
             f"Reference accuracy {reference:.4f} ({reference_source})."), "", "## Summary", "", table, ""]
    if args.baseline:
        page += [f"## Speedup over {args.baseline}", "",
                 (f"NFE of {args.baseline} / NFE of the family at the same accuracy, both interpolated linearly "
                  "along their fronts; — where a front never reaches that accuracy."), "",
                 pareto.speedup_table(selected, args.baseline, speedup_levels(reference, args.keep)), ""]
    if args.notes:
        page += [args.notes.read_text().strip(), ""]
    page += ["## Command", "", "```", command, "```", ""]
    out.with_name(out.name + ".md").write_text("\n".join(page))
    with out.with_name(out.name + ".jsonl").open("w") as handle:
        for row in pareto.sort_rows(selected):
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/pareto.py", *argv])
    try:
        table = run(args, command)
    except (OSError, ValueError) as error:
        print(f"pareto.py: error: {error}", file=sys.stderr)
        return 2
    print(table)
    print(f"wrote {args.out}.png, {args.out}.md, {args.out}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy-vs-NFE Pareto fronts of the samplers evaluated on one task: a plot, a markdown page, the rows used.

    python scripts/pareto.py results/evaluations.jsonl multirun/ --task sudoku \
        --out docs/results/sudoku_pareto --baseline topk-confidence

RESULTS are JSONL files and/or directories (every *.jsonl below them). Each job of an `evaluate.py -m` multirun
saves its rows as rows.jsonl in its directory; a multirun directory made before that (rows only in the results
file) stands for the results_file its multirun.yaml names. Writes <out>.png (fronts per family, the
overall front, the oracle floor), <out>.md (summary table, speedups over the baseline, the command) and
<out>.jsonl (the de-duplicated rows used, sorted), and prints the summary table.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import yaml

from mdmkit.analysis import pareto
from mdmkit.analysis.pages import Page, command_line
from mdmkit.analysis.pareto_plot import plot_fronts
from mdmkit.analysis.pareto_tables import speedup_table, summary_table
from mdmkit.io.naming import ORACLE, derive_family

KEEP_LEVELS = (0.90, 0.95, 0.99, 1.0)  # speedups at these fractions of the reference accuracy, plus --keep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSONL results files or directories holding them")
    parser.add_argument("--out", required=True, help="output prefix: writes <out>.png, <out>.md, <out>.jsonl")
    parser.add_argument("--task", required=True, help="task name, e.g. sudoku")
    parser.add_argument("--checkpoint", help="checkpoint sha (or a >= 7 character prefix), path or file name")
    parser.add_argument("--baseline", help="family to compare against, e.g. topk-confidence")
    parser.add_argument("--limit", type=int, help="only rows evaluated on this many test examples (`n`)")
    parser.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE",
                        help="only rows whose FIELD (a dotted path: test_set, seed, sampler.cache, ...) reads VALUE; "
                             "repeatable")
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
    parser.add_argument("--metric", default="accuracy",
                        help="row field on the quality axis (default accuracy; e.g. spelling_accuracy for text)")
    parser.add_argument("--tag", action="append", default=[], metavar="CHECKPOINT=LABEL",
                        help="compare several checkpoints: prefix the families of CHECKPOINT (sha prefix, path or "
                             "file name) with LABEL; repeat once per checkpoint")
    parser.add_argument("--notes", type=Path, help="markdown file inserted after the summary (analysis, commands)")
    args = parser.parse_args(argv)
    if not 0 < args.keep <= 1:
        parser.error(f"--keep {args.keep} must be in (0, 1]")
    if any("=" not in tag for tag in args.tag):
        parser.error("--tag takes CHECKPOINT=LABEL")
    if args.tag and args.checkpoint:
        parser.error("--tag and --checkpoint exclude each other")
    return args


def tag_families(rows: list[dict], tags: list[str]) -> list[dict]:
    """Families prefixed by their checkpoint's label, so that fronts of several checkpoints share one page (rows
    of such a page, already prefixed, keep theirs: the page's .jsonl redraws it)."""
    tagged = []
    for row in rows:
        labels = [label for checkpoint, label in (t.split("=", 1) for t in tags)
                  if pareto.select_rows([row], checkpoint=checkpoint)]
        if len(labels) != 1:
            raise ValueError(f"checkpoint {pareto.checkpoints([row])[0]} matches {len(labels)} --tag options")
        prefix = f"{labels[0]}: "
        if str(row.get("family") or "").startswith(prefix):  # a row of such a page
            tagged.append(dict(row))
        else:  # the preset folded into the tagged family, so that it is not applied again
            tagged.append({**row, "family": prefix + derive_family(row), "preset": None})
    return tagged


def field_of(row: dict, path: str) -> object:
    """The value at a dotted path of a row (`sampler.cache`), or None."""
    value: object = row
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def filtered(rows: list[dict], limit: int | None, where: list[str]) -> list[dict]:
    """Rows kept by `--limit` and every `--where FIELD=VALUE` (values compared as text: `seed=0`, `cache=none`)."""
    conditions = []
    for condition in where:
        field, equals, value = condition.partition("=")
        if not equals or not field:
            raise ValueError(f"--where {condition}: expected FIELD=VALUE")
        conditions.append((field, value))
    return [row for row in rows if (limit is None or row.get("n") == limit)
            and all(str(field_of(row, field)).lower() == value.lower() for field, value in conditions)]


def test_sets(rows: list[dict]) -> str:
    """The test sets among rows, with how to pick each: `--where test_set=...` and its size."""
    counts = Counter((str(row.get("test_set")), row.get("n")) for row in rows)
    return "; ".join(f"--where test_set={name} --limit {n} ({count} rows)" for (name, n), count in sorted(
        counts.items(), key=lambda item: -item[1]))


def speedup_levels(reference: float, keep: float) -> list[float]:
    """Rounded down to 6 decimals: rounding up could put the level 1.0 x reference above every front."""
    return sorted({math.floor(fraction * reference * 1e6) / 1e6 for fraction in (*KEEP_LEVELS, keep)})


def with_multirun_files(paths: list[str]) -> list[str]:
    """`paths`, plus for each Hydra multirun below a directory that holds no rows of its own (its jobs ran before
    they saved rows.jsonl) the results_file that its jobs appended to, read from its multirun.yaml."""
    found = list(paths)
    for raw in paths:
        root = Path(raw).expanduser()
        for sweep in sorted(root.rglob("multirun.yaml")) if root.is_dir() else []:
            if any(sweep.parent.rglob("*.jsonl")):
                continue
            config = yaml.safe_load(sweep.read_text()) or {}
            name = config.get("results_file")
            if not isinstance(name, str) or "${" in name:
                print(f"pareto.py: {sweep.parent} holds no rows and names no plain results_file", file=sys.stderr)
                continue
            file = Path(name).expanduser()
            if not file.is_absolute():  # relative to where the multirun was started
                file = Path(config.get("hydra", {}).get("runtime", {}).get("cwd") or ".") / file
            if file.is_file() and str(file) not in found:
                print(f"pareto.py: {sweep.parent} holds no rows of its own: reading its results_file {file}",
                      file=sys.stderr)
                found.append(str(file))
    return found


def run(args: argparse.Namespace, command: str) -> str:
    rows = pareto.load_rows(with_multirun_files(args.results))
    if not rows:
        raise ValueError(f"no evaluate or oracle rows in {' '.join(args.results)}")
    selected = pareto.select_rows(rows, task=args.task, checkpoint=args.checkpoint)
    if not selected:
        tasks = sorted({str(r.get("task")) for r in rows})
        where = f" and checkpoint {args.checkpoint}" if args.checkpoint else ""
        raise ValueError(f"no rows for task {args.task}{where} (tasks found: {', '.join(tasks)})")
    selected = filtered(selected, args.limit, args.where)
    if not selected:
        raise ValueError(f"no rows of task {args.task} pass --limit / --where")
    if args.tag:
        selected = tag_families(selected, args.tag)
    recorded = pareto.recorded_with(selected, args.metric)  # what the page's .jsonl keeps
    selected = pareto.on_axes(selected, args.metric, args.cost)  # every later step reads accuracy and nfe_mean
    found = pareto.checkpoints(selected)
    if len(found) > 1 and not args.tag:
        raise ValueError(f"rows of task {args.task} come from {len(found)} checkpoints ({', '.join(found)}): "
                         "pick one with --checkpoint")
    differences = pareto.test_set_differences(selected)  # another n_givens, test_file or limit: no comparison
    if differences:
        raise ValueError(f"rows of task {args.task} were measured on different test sets ({'; '.join(differences)}):"
                         f" pick one with {test_sets(selected)}")
    families = pareto.families(selected)
    if args.baseline and args.baseline not in families:
        raise ValueError(f"baseline family {args.baseline} has no rows (families: {', '.join(families)})")
    if not pareto.overall_front(selected):
        raise ValueError(f"no evaluate rows with {args.metric} and nfe_mean for task {args.task}")

    reference = args.reference_accuracy
    if reference is None:
        reference = pareto.reference_accuracy_of(selected, args.baseline)
        if reference is None:
            reference = pareto.reference_accuracy_of(selected)
    checkpoint = ", ".join(found)
    x_name = "cost (NFE + extra passes)" if args.cost else "NFE"
    named = Path(str(selected[0].get("checkpoint") or found[0])).name
    size = f"{selected[0]['n']} test examples" if selected[0].get("n") else "test split"
    title = args.title or f"{args.task}: {args.metric} vs {x_name} ({named}, {size})"
    page = Page(Path(args.out))
    xlabel = ("cost (mean forward passes, extra passes at their share)" if args.cost
              else "NFE (mean forward passes per example)")
    png = plot_fronts(selected, page.file(".png"), title, log_nfe=args.log_nfe, baseline_family=args.baseline,
                      xlabel=xlabel, ylabel=args.metric)
    x_short = "cost" if args.cost else "NFE"
    table = summary_table(selected, reference_accuracy=reference, keep=args.keep, x_name=x_short)

    reference_source = ("given" if args.reference_accuracy is not None
                        else f"best accuracy of {args.baseline}" if args.baseline else "best accuracy of all runs")
    lines = [f"# {title}", "", f"![{args.metric} vs {x_name}]({png.name})", "",
             (f"Task `{args.task}`, checkpoint `{checkpoint}`; {len(selected)} rows "
              f"({sum(r.get('kind') == ORACLE for r in selected)} oracle floor). "
              f"Reference {args.metric} {reference:.4f} ({reference_source}). Error bars: 95% Wilson score "
              "intervals of accuracy."
              + ("" if args.metric == "accuracy" else f" The tables' accuracy columns hold {args.metric}.")),
             "", "## Summary", "", table, ""]
    if args.baseline:
        lines += [f"## Speedup over {args.baseline}", "",
                  (f"{x_short} of {args.baseline} / {x_short} of the family at the same accuracy, both interpolated "
                   "linearly along their fronts; — where a front never reaches that accuracy."), "",
                  speedup_table(selected, args.baseline, speedup_levels(reference, args.keep), x_short), ""]
    if args.notes:
        lines += [args.notes.read_text().strip(), ""]
    lines += ["## Command", "", "```", command, "```"]
    page.write(markdown=lines, rows=pareto.sort_rows(recorded))  # as recorded: --cost changes only the axes
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = command_line(__file__, argv)
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

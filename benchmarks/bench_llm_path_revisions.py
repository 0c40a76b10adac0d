"""Two revisions of the code side by side on the same `bench_llm_path` command: what a speed change bought.

    python -m benchmarks.bench_llm_path_revisions --before 5de92f4 --after a457ff2 --rounds 2 \
        --out docs/results/llm_path_changes -- --scale 256,2 --prompts 256 --answer 128 --steps-per-block 4 \
        --batches 1 4 --repeats 2 --rules

Each revision is checked out into a temporary git worktree and the benchmark runs there, the revisions alternating
round by round (before, after, before, after, ...) so that drift of a shared machine falls on both alike. The page
compares tokens/s, ms per forward and host syncs per forward case by case: the median over rounds of each revision
and their ratio. `--runs DIR` re-makes the page from the runs kept in DIR (`<revision>-<round>.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mdmkit.analysis.pages import ROOT, Page, command_line, markdown_table, run_script, stamp

MEASURES = ("tokens_per_s", "ms_per_forward", "loop_share", "loop_syncs_per_forward")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision before the change")
    parser.add_argument("--after", required=True, help="git revision after it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/results/llm_path_changes"))
    parser.add_argument("--runs", type=Path, default=None, help="a directory of earlier runs: only make the page")
    parser.add_argument("--note", action="append", default=[], help="a line under the table (repeatable)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then bench_llm_path's arguments")
    args = parser.parse_args(argv)
    args.bench = [a for a in args.bench if a != "--"] if args.bench else []
    return args


def run_rounds(args: argparse.Namespace, runs: Path) -> None:
    with tempfile.TemporaryDirectory() as trees:
        for name in ("before", "after"):
            subprocess.run(["git", "worktree", "add", "-q", "--detach", f"{trees}/{name}", getattr(args, name)],
                           cwd=ROOT, check=True)
        try:
            for round_ in range(1, args.rounds + 1):
                for name in ("before", "after"):
                    out = runs / f"{name}-{round_}"
                    print(f"round {round_}: {name} ({getattr(args, name)})", flush=True)
                    subprocess.run([sys.executable, "-m", "benchmarks.bench_llm_path", *args.bench, "--out",
                                    str(out)], cwd=f"{trees}/{name}", check=True)
                    for made in (".md", ".png"):  # a run's own page: its rows are what the comparison reads
                        out.with_name(out.name + made).unlink(missing_ok=True)
        finally:
            for name in ("before", "after"):
                subprocess.run(["git", "worktree", "remove", "--force", f"{trees}/{name}"], cwd=ROOT, check=False)


def cases_of(runs: Path, name: str) -> dict[tuple, list[dict[str, Any]]]:
    """{(model, prompt, batch, mode): [the case of each round]} of one revision's runs."""
    cases: dict[tuple, list[dict[str, Any]]] = {}
    for path in sorted(runs.glob(f"{name}-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "mode" in row and "tokens_per_s" in row:
                cases.setdefault((row["model"], row["prompt"], row["batch"], row["mode"]), []).append(row)
    return cases


def compare(runs: Path) -> list[dict[str, Any]]:
    before, after = cases_of(runs, "before"), cases_of(runs, "after")
    entries = []
    for key in sorted(set(before) & set(after)):
        entry: dict[str, Any] = dict(zip(("model", "prompt", "batch", "mode"), key))
        for measure in MEASURES:
            old = statistics.median(c[measure] for c in before[key])
            new = statistics.median(c[measure] for c in after[key])
            entry[measure] = {"before": old, "after": new, "ratio": new / old if old else None}
        entries.append(entry)
    return entries


def page_markdown(record: dict[str, Any], entries: list[dict[str, Any]]) -> list[str]:
    rows = [[e["model"], e["prompt"], e["batch"], e["mode"],
             f"{e['tokens_per_s']['before']:.2f}", f"{e['tokens_per_s']['after']:.2f}",
             f"**{e['tokens_per_s']['ratio']:.2f}x**",
             f"{e['ms_per_forward']['before']:.1f} → {e['ms_per_forward']['after']:.1f}",
             f"{e['loop_syncs_per_forward']['before']:.1f} → {e['loop_syncs_per_forward']['after']:.1f}"]
            for e in entries]
    return [f"# The LLM path before and after {record['after']} ({record['machine']})", "",
            f"Made by `{record['command']}` on {record['date']}; the runs' rows are in `{record['runs']}/`.", "",
            (f"`python -m benchmarks.bench_llm_path {' '.join(record['bench'])}` at {record['before']} (before) "
             f"and {record['after']} (after), alternating for {record['rounds']} rounds; each cell is the median "
             "over the rounds of one revision."), "",
            markdown_table(["model", "prompt", "batch", "cache", "tokens/s before", "after", "after / before",
                            "ms/forward", "host syncs/forward"], rows, "lrrlrrrrr"), "",
            *(f"- {note}" for note in record.get("notes", []))]


def page_figure(entries: list[dict[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4), dpi=110)
    labels = [f"{e['model']}\np{e['prompt']} b{e['batch']} {e['mode']}" for e in entries]
    axis.bar(range(len(entries)), [e["tokens_per_s"]["ratio"] for e in entries])
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(entries)), labels, fontsize=6)
    axis.set_ylabel("tokens/s after / before")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    page = Page(args.out)
    runs = args.runs or page.file("")
    runs.mkdir(parents=True, exist_ok=True)
    if args.runs is None:
        run_rounds(args, runs)
    entries = compare(runs)
    made_by = list(argv)
    if args.runs is not None:  # the page names the command that made the runs, and where they are kept
        at = made_by.index("--runs")
        del made_by[at: at + 2]
    record = {"command": command_line(__file__, made_by), **stamp(), "before": args.before, "after": args.after,
              "rounds": args.rounds, "bench": args.bench, "runs": str(runs), "notes": args.note, "entries": entries}
    print("wrote " + ", ".join(map(str, page.write(markdown=page_markdown(record, entries), data=record,
                                                   figure=page_figure(entries)))))


if __name__ == "__main__":
    run_script(main, "bench_llm_path_revisions")

"""Time per program of the code sandbox: HumanEval and MBPP reference solutions scored end to end.

    python -m benchmarks.bench_sandbox --label before             # on the code before a change (any sandbox)
    python -m benchmarks.bench_sandbox --mode bwrap               # this checkout, bubblewrap isolation
    python -m benchmarks.bench_sandbox --mode process             # this checkout, the process fallback
    python -m benchmarks.bench_sandbox --mode bwrap --quick       # smoke run (40 programs each, 1 repeat)
    python -m benchmarks.bench_sandbox --render                   # only re-make the page (markdown, figure)

On a shared machine, alternate the labels with `--repeats 1 --append` in rounds (the page's numbers were made
so, the `before` label from a copy of the previous commit with this script copied in).

Each run scores the reference solutions through `CodeTask.score` (what `evaluate.py task=humaneval|mbpp`
does: build the programs, run them in the sandbox, read the verdicts) and records the wall time divided by
the number of programs, with 1 and 2 workers, as the median of --repeats trials. Runs are merged by label into
`<out>.json`, so the page compares the code before a change with the modes after it; the markdown is re-made
from all runs each time. Only the public task API is used, so the script runs unchanged on older checkouts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mdmkit.analysis.pages import Page, command_line, markdown_table, stamp
from mdmkit.tasks.code import MBPP_SPLITS, HumanEvalTask, MBPPTask

DATA = Path(os.environ.get("MDMKIT_BENCHMARK_DATA", ROOT.parent / "shared" / "data" / "benchmarks"))


def workloads(quick: bool) -> dict[str, tuple[object, list[dict], list[str]]]:
    """benchmark -> (task, documents, reference generations); MBPP is the whole release (all splits)."""
    human = HumanEvalTask(data_dir=str(DATA))
    with gzip.open(DATA / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        he_docs = [json.loads(line) for line in f if line.strip()]
    mbpp = MBPPTask(data_dir=str(DATA))
    mb_docs = sorted((d for split in MBPP_SPLITS for d in mbpp.docs(split)), key=lambda d: d["task_id"])
    cut = 40 if quick else None
    he_docs, mb_docs = he_docs[:cut], mb_docs[:cut]
    return {
        "humaneval": (human, he_docs, [d["canonical_solution"] for d in he_docs]),
        "mbpp": (mbpp, mb_docs, [d["code"] + "\n[DONE]" for d in mb_docs]),
    }


def measure(loads: dict, workers: list[int], repeats: int, earlier: list[dict]) -> list[dict]:
    """Trials interleaved across settings, so drifting machine load hits every setting alike; `earlier` rows'
    trials (--append) are kept and added to."""
    wall: dict[tuple[str, int], list[float]] = {(name, w): [] for name in loads for w in workers}
    passed: dict[tuple[str, int], list[int]] = {key: [] for key in wall}
    failed: dict[tuple[str, int], list[list]] = {key: [] for key in wall}
    for _ in range(repeats):
        for name, (task, docs, generations) in loads.items():
            for w in workers:
                task.sandbox_workers = w
                start = time.perf_counter()
                verdicts = task.score(docs, generations)
                wall[name, w].append(time.perf_counter() - start)
                passed[name, w].append(sum(v.correct for v in verdicts))
                failed[name, w].append([f"{d.get('task_id')}: {v.detail[:120]}" for d, v in zip(docs, verdicts)
                                        if not v.correct])
    before = {(r["benchmark"], r["workers"]): r for r in earlier}
    rows = []
    for key, times in wall.items():
        (name, w), old = key, before.get(key, {})
        n = len(loads[name][1])
        per = old.get("trials_ms", []) + [round(t / n * 1000, 2) for t in times]
        rows.append({"benchmark": name, "workers": w, "programs": n,
                     "passed_trials": old.get("passed_trials", []) + passed[key],
                     "failed_trials": old.get("failed_trials", []) + failed[key],
                     "ms_per_program": round(statistics.median(per), 2), "ms_min": min(per), "ms_max": max(per),
                     "trials_ms": per})
    return rows


def isolation_line() -> str:
    try:
        from mdmkit.sandbox import describe_isolation
    except ImportError:
        return "the sandbox before isolation modes (one process per program, no bwrap)"
    return describe_isolation()


def render(runs: dict[str, dict], baseline: str | None, page: Page) -> list[str]:
    intro = ("HumanEval (164 canonical solutions) and MBPP (all 974 reference solutions) scored end to end "
             "through `CodeTask.score`: wall time / programs, median [min-max] over trials. `x before` is the "
             f"ratio to the run labelled `{baseline}` at the same number of workers (goal: <= 2x).")
    lines = ["# Code sandbox: time per program", "", intro, ""]
    base = {(r["benchmark"], r["workers"]): r["ms_per_program"] for r in runs.get(baseline, {}).get("rows", [])}
    table = []
    for label, run in runs.items():
        for r in run["rows"]:
            ref = base.get((r["benchmark"], r["workers"]))
            ratio = f"{r['ms_per_program'] / ref:.2f}" if ref and label != baseline else ""
            low, high = min(r["passed_trials"]), max(r["passed_trials"])
            table.append([label, r["benchmark"], r["workers"],
                          f"{low}/{r['programs']}" if low == high else f"{low}-{high}/{r['programs']}",
                          f"{r['ms_per_program']:.1f} [{r['ms_min']:.1f}-{r['ms_max']:.1f}]", ratio])
    lines.append(markdown_table(["run", "benchmark", "workers", "passed", "ms / program", "x before"], table,
                                "lllrrr"))
    lines += ["", f"![ms per program]({page.name('.png')})", ""]
    for label, run in runs.items():
        commit = run.get("git_commit") or "not recorded (see the note)"
        lines.append(f"- `{label}`: {run['isolation']}; {run['machine']}, commit {commit}, {run['date']}; "
                     f"{run['repeats']} trials. Reproduce: `{run['command']}`"
                     + (f". {run['note']}" if run.get("note") else ""))
    lines.append("")
    lines.append("Data: `sandbox_overhead.json` (every trial, with the programs that failed and why). The "
                 "machine is shared, so trials vary: runs made with `--append` in alternation (one trial of each "
                 "label per round) compare fairly.")
    return lines


def figure(runs: dict[str, dict]):
    """Each run's ms per program (median bar, min-max whisker) by benchmark and number of workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["benchmark"], r["workers"]) for run in runs.values() for r in run["rows"]})
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    width = 0.8 / max(1, len(runs))
    for i, (label, run) in enumerate(runs.items()):
        rows = {(r["benchmark"], r["workers"]): r for r in run["rows"]}
        shown = [(k, rows[key]) for k, key in enumerate(keys) if key in rows]
        ms = [r["ms_per_program"] for _, r in shown]
        spread = [[m - r["ms_min"] for m, (_, r) in zip(ms, shown)], [r["ms_max"] - m for m, (_, r) in zip(ms, shown)]]
        ax.bar([k + i * width for k, _ in shown], ms, width, yerr=spread, capsize=3, label=label)
    ax.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(keys))],
                  [f"{name}\n{w} worker{'s' if w > 1 else ''}" for name, w in keys])
    ax.set_ylabel("ms per program")
    ax.legend()
    fig.tight_layout()
    return fig


def _reproducing(argv: list[str]) -> list[str]:
    """The arguments that make the run again: without --append, --note and its text."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--append":
            skip = False
            continue
        if arg == "--note":
            skip = True
            continue
        if not arg.startswith("--note="):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["auto", "bwrap", "process"], default=None,
                        help="sets MDMKIT_SANDBOX_ISOLATION for this run (default: unset)")
    parser.add_argument("--label", default=None, help="the run's name on the page (default: the mode)")
    parser.add_argument("--baseline", default="before", help="the label ratios are taken against")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="40 programs per benchmark, 1 trial")
    parser.add_argument("--note", default="", help="a sentence added to the run's line on the page")
    parser.add_argument("--append", action="store_true",
                        help="add the trials to the label's earlier ones (to interleave runs of several labels)")
    parser.add_argument("--render", action="store_true", help="only re-make the page from <out>.json")
    parser.add_argument("--out", type=Path, default=Path("docs/results/sandbox_overhead"))
    args = parser.parse_args(argv)
    if args.mode:
        os.environ["MDMKIT_SANDBOX_ISOLATION"] = args.mode
    os.environ["MDMKIT_ALLOW_CODE_EXECUTION"] = "1"
    label = args.label or args.mode or "default"
    repeats = 1 if args.quick else args.repeats

    page = Page(args.out)
    path = page.file(".json")
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    if args.render:
        written = page.write(markdown=render(runs, args.baseline, page), figure=figure(runs))
        print("wrote " + ", ".join(map(str, written)))
        return
    earlier = runs.get(label, {}).get("rows", []) if args.append else []
    rows = measure(workloads(args.quick), args.workers, repeats, earlier)
    for r in rows:
        print(f"{label}: {r['benchmark']} workers={r['workers']}: {r['passed_trials'][-1]}/{r['programs']} passed, "
              f"{r['ms_per_program']:.1f} ms/program", flush=True)
    trials = len(rows[0]["trials_ms"]) if rows else 0
    runs[label] = {"rows": rows, "isolation": isolation_line(), "repeats": trials, "note": args.note,
                   "command": command_line(__file__, _reproducing(argv)), **stamp()}
    written = page.write(data={"runs": runs}, markdown=render(runs, args.baseline, page), figure=figure(runs))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

"""Write a results page for a finished training run: curve (PNG), numbers (JSON) and a markdown summary.

    python scripts/training_report.py outputs/sudoku_mdm/<time> --name sudoku_mdm \
        --command "python train.py experiment=sudoku_mdm"

Reads the run's CSV log and the `kind: train` record that the run appended to the results file (or to
`results.jsonl` in the run's directory, where tools/device/device_train.sh puts it). A training chained over device
calls keeps its later legs in `<run>/leg1`, `leg2`, ... (docs/results/runs/): the page joins them into one curve,
each leg's steps counted on from the leg before, and lists the legs. The training time is every call's
(`calls.jsonl` in each leg, calls stopped by a time limit or Ctrl-C included). The test numbers come from the
latest `kind: evaluate` record of the committed checkpoint `checkpoints/<name>.pt` when there is one, else from the
run's own evaluation after training. The page goes to the run directory unless `--out` names another.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mdmkit.analysis.pages import Page, command_line, markdown_table
from mdmkit.io.naming import row_label
from mdmkit.io.results import read_records
from mdmkit.training.train import CALLS_FILE


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every logged series of the run, by step. A resumed run logs to a new `csv/version_<n>`; where it went back
    to an earlier checkpoint, its values replace the earlier version's from that step on."""
    series: dict[str, list[tuple[int, float]]] = {}
    versions = sorted(run_dir.glob("csv/version_*/metrics.csv"), key=lambda p: (len(p.parent.name), p.parent.name))
    for path in versions:
        with path.open() as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            continue
        start = min(int(row["step"]) for row in rows)
        for key, points in series.items():
            series[key] = [(step, value) for step, value in points if step < start]
        for row in rows:
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def run_legs(run_dir: Path) -> list[Path]:
    """The run directory, then its later legs `leg1`, `leg2`, ... (tools/device/device_train.sh), in order."""
    later = [p for p in run_dir.glob("leg*") if p.is_dir() and p.name[3:].isdigit()]
    return [run_dir, *sorted(later, key=lambda p: int(p.name[3:]))]


def train_record(records: list[dict], leg: Path, run_dir: Path) -> dict | None:
    """`leg`'s model.pt as its newest `kind: train` record says (steps, test), with the minutes of every call
    that trained it (a leg resumed by a second call records twice) and how its first call `started`. Matched by
    the path's tail from the run's name on: a leg trained on another machine recorded its path there."""
    tail = (run_dir.resolve().name, *leg.resolve().relative_to(run_dir.resolve()).parts, "model.pt")
    matching = [r for r in records if r.get("kind") == "train" and Path(r["checkpoint"]).parts[-len(tail):] == tail]
    if not matching:
        return None
    calls = read_records(leg / CALLS_FILE)  # every call's time, those stopped before their record included
    # records older than calls.jsonl hold one call's time each (newer ones, the run's over its calls so far)
    seconds = sum(c["seconds"] for c in calls) if calls else sum(r["train_time_s"] for r in matching)
    return {**matching[-1], "train_time_s": seconds, "calls": len(calls) or len(matching),
            "started": started_from(matching[0]["config"])}


def joined_metrics(legs: list[tuple[dict[str, list[tuple[int, float]]], dict]]
                   ) -> tuple[dict[str, list[tuple[int, float]]], list[int]]:
    """Every leg's series (`read_metrics`, with the leg's train record) on one step axis (a leg's steps start where
    the leg before stopped) and the steps at which legs 2, 3, ... began."""
    series: dict[str, list[tuple[int, float]]] = {}
    offset, starts = 0, []
    for number, (metrics, record) in enumerate(legs):
        if number:
            starts.append(offset)
        for key, points in metrics.items():
            series.setdefault(key, []).extend((offset + step, value) for step, value in points)
        offset += record["global_step"]
    return series, starts


def step_rate(metrics: dict[str, list[tuple[int, float]]]) -> float | None:
    """A leg's training steps a second: the median of its logged windows (`train/steps_per_s`: the first holds
    the start-up), None for a run logged before the rate was."""
    rates = [value for _, value in metrics.get("train/steps_per_s", [])]
    return statistics.median(rates) if rates else None


def started_from(config: dict) -> str:
    if config.get("ckpt_path"):
        return f"resumed `{config['ckpt_path']}`"
    if config.get("init_from"):
        return f"warm restart from `{config['init_from']}`"
    return "fresh"


def figure(series: dict[str, list[tuple[int, float]]], title: str, leg_starts: list[int]) -> plt.Figure:
    """Loss (train and validation) and validation accuracy against the training step; dashed: a new leg."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    for ax in (ax_loss, ax_acc):
        for number, step in enumerate(leg_starts):
            ax.axvline(step, color="grey", linestyle="--", linewidth=0.8, label="new leg" if number == 0 else None)
    for key, label in (("train/loss", "train loss"), ("val/loss", "val loss (EMA)")):
        if key in series:
            steps, values = zip(*series[key])
            ax_loss.plot(steps, values, label=label, marker="o" if key.startswith("val") else None)
    ax_loss.set(xlabel="step", ylabel="masked diffusion loss", yscale="log", title="loss")
    ax_loss.legend()
    if "val/accuracy" in series:
        steps, values = zip(*series["val/accuracy"])
        ax_acc.plot(steps, values, marker="o", label="val accuracy, full-step top-1 confidence (EMA)")
        ax_acc.legend(loc="lower right")
    else:  # a run that evaluated nothing yet: say so on the panel rather than leave it blank
        ax_acc.text(0.5, 0.5, "no validation accuracy logged", ha="center", va="center", transform=ax_acc.transAxes)
    ax_acc.set(xlabel="step", ylabel="fraction solved", ylim=(0, 1.02), title="validation accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def leg_table(legs: list[tuple[Path, dict]]) -> list[str]:
    """Markdown lines listing the legs of a chained training (nothing for a run of one leg)."""
    if len(legs) < 2:
        return []
    rows, first = [], 0
    for number, (leg, r) in enumerate(legs, start=1):
        started = r["started"] + (f", then resumed ({r['calls']} calls)" if r["calls"] > 1 else "")
        rate = "" if r["steps_per_s"] is None else f"{r['steps_per_s']:.1f}"
        rows.append([number, f"`{leg}`", started, f"{first}-{first + r['global_step']}",
                     f"{r['train_time_s'] / 60:.1f}", rate, r["machine"], r["time"]])
        first += r["global_step"]
    header = ["leg", "run directory", "started", "steps (joined)", "minutes", "steps/s", "machine", "finished"]
    return [markdown_table(header, rows, align="rllrrrll"), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True, help="page name (<out>/<name>.md, .png, .json)")
    parser.add_argument("--command", required=True, help="the command that produced the run")
    parser.add_argument("--results-file", type=Path, default=Path("results/evaluations.jsonl"))
    parser.add_argument("--out", type=Path, help="page directory (default: the run directory)")
    parser.add_argument("--notes", type=Path, help="markdown file appended to the page (analysis, the legs' story)")
    args = parser.parse_args()
    if not args.run_dir.is_dir():
        raise SystemExit(f"training_report.py: error: no run directory {args.run_dir}")

    leg_dirs = run_legs(args.run_dir)
    records = list(read_records(args.results_file))
    for leg in leg_dirs:  # tools/device/device_train.sh: each leg's records in its own directory
        if (leg / "results.jsonl").resolve() != args.results_file.resolve():
            records += read_records(leg / "results.jsonl")  # nothing where the file is absent
    records = list({json.dumps(r, sort_keys=True): r for r in records}.values())  # one copy of a record in two files
    legs = [(leg, train_record(records, leg, args.run_dir)) for leg in leg_dirs]
    missing = [str(leg / "model.pt") for leg, found in legs if found is None]
    if missing:
        raise SystemExit(f"no train record for {', '.join(missing)} in {args.results_file} or the legs' results.jsonl")
    metrics = [read_metrics(leg) for leg in leg_dirs]
    legs = [(leg, {**r, "steps_per_s": step_rate(m)}) for (leg, r), m in zip(legs, metrics)]
    record = legs[-1][1]
    committed = f"checkpoints/{args.name}.pt"
    evaluations = [r for r in records if r.get("kind") == "evaluate" and r["checkpoint"].endswith(committed)]
    tested = evaluations[-1] if evaluations else record
    model_file = committed if Path(committed).is_file() else str(leg_dirs[-1] / "model.pt")
    series, leg_starts = joined_metrics([(m, r) for m, (_, r) in zip(metrics, legs)])
    page = Page((args.out or args.run_dir) / args.name)
    steps = sum(r["global_step"] for _, r in legs)
    train_time = sum(r["train_time_s"] for _, r in legs)
    machines = " + ".join(dict.fromkeys(r["machine"] for _, r in legs))

    config = record["config"]
    summary = {
        "name": args.name,
        "command": args.command,
        "machine": machines,
        "train_time_s": train_time,
        "steps": steps,
        "legs": [{"dir": str(leg), "steps": r["global_step"], "train_time_s": r["train_time_s"],
                  "calls": r["calls"], "steps_per_s": r["steps_per_s"], "machine": r["machine"],
                  "started": r["started"], "time": r["time"]}
                 for leg, r in legs],
        "test_accuracy": tested["accuracy"],
        "test_examples": tested["n"],
        "nfe_mean": tested["nfe_mean"],
        "nfe": tested["nfe"],
        "sampler": tested["sampler"],
        "weights": tested["weights"],
        "evaluated_on": tested["machine"],
        "test_accuracy_at_training_end": record["accuracy"],
        "model": config["model"],
        "task": config["task"],
        "val_accuracy": series.get("val/accuracy", []),
    }
    rate = record["steps_per_s"]  # several legs: each one's in the leg table
    how_fast = (f", in {len(legs)} legs" if len(legs) > 1
                else "" if rate is None else f", {rate:.1f} steps/s (median of the logged windows)")
    sampler, model = tested["sampler"], config["model"]
    task = {k: v for k, v in config["task"].items() if k not in ("_target_", "cache_dir")}
    how = (f"full-step: Top-{sampler['k']}, {sampler['ordering']} ordering" if "k" in sampler and "ordering" in sampler
           else row_label(tested))  # a speculative or causal run tests with its own sampler
    shape = (f"{model['n_layers']} layers, d_model {model['d_model']}, {model['positions']} positions"
             if {"n_layers", "d_model", "positions"} <= set(model) else
             f"`{json.dumps({k: v for k, v in model.items() if k != '_target_'})}`")
    facts = [
        [f"test accuracy ({how}, EMA weights)",
         f"**{tested['accuracy']:.1%}** on {tested['n']} held-out examples"],
        ["NFE per sample",
         f"mean {tested['nfe_mean']:.2f}, min {tested['nfe']['min']}, max {tested['nfe']['max']}"],
        ["training", f"{steps} steps, batch {config['data']['batch_size']}, {train_time / 60:.1f} min on {machines}"
                     + how_fast],
        ["model", shape],
        ["task", f"`{json.dumps(task)}`"],
    ]
    numbers = page.name(".json")
    markdown = [
        f"# {args.name}", "",
        f"Trained by `{args.command}` on {machines} ({record['time']}); tested on {tested['machine']}.",
        "", markdown_table(["", ""], facts), "",
        *leg_table(legs),
        f"![training curve]({page.name('.png')})", "",
        f"Numbers: [`{numbers}`]({numbers}). Evaluate the model again with",
        f"`python evaluate.py ckpt={model_file}`.", "",
        *([args.notes.read_text().strip(), ""] if args.notes else []),
        "## Page", "", "```", command_line(__file__, sys.argv[1:]), "```",
    ]
    written = page.write(figure=figure(series, args.name, leg_starts), data=summary, markdown=markdown)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

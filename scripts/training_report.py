"""Write a results page for a finished training run: curve (PNG), numbers (JSON) and a markdown summary.

    python scripts/training_report.py outputs/sudoku_mdm/<time> --name sudoku_mdm \
        --command "python train.py experiment=sudoku_mdm"

Reads the run's CSV log and the `kind: train` record that the run appended to the results file. The test
numbers come from the latest `kind: evaluate` record of the committed checkpoint `checkpoints/<name>.pt`
(`python evaluate.py ckpt=checkpoints/<name>.pt`) when there is one, so the page states what anyone re-running
that command on this machine gets, wherever the model was trained.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mdmkit.analysis.pages import Page, markdown_table  # noqa: E402
from mdmkit.io.results import read_records  # noqa: E402


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


def figure(series: dict[str, list[tuple[int, float]]], title: str) -> plt.Figure:
    """Loss (train and validation) and validation accuracy against the training step."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    for key, label in (("train/loss", "train loss"), ("val/loss", "val loss (EMA)")):
        if key in series:
            steps, values = zip(*series[key])
            ax_loss.plot(steps, values, label=label, marker="o" if key.startswith("val") else None)
    ax_loss.set(xlabel="step", ylabel="masked diffusion loss", yscale="log", title="loss")
    ax_loss.legend()
    if "val/accuracy" in series:
        steps, values = zip(*series["val/accuracy"])
        ax_acc.plot(steps, values, marker="o", label="val accuracy, full-step top-1 confidence (EMA)")
    ax_acc.set(xlabel="step", ylabel="fraction solved", ylim=(0, 1.02), title="validation accuracy")
    ax_acc.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True, help="page name under docs/results/")
    parser.add_argument("--command", required=True, help="the command that produced the run")
    parser.add_argument("--results-file", type=Path, default=Path("results/evaluations.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--notes", default="", help="extra markdown appended to the page")
    args = parser.parse_args()

    model_path = (args.run_dir / "model.pt").resolve()  # records hold absolute paths; run_dir may be relative
    records = [r for r in read_records(args.results_file)
               if r.get("kind") == "train" and Path(r["checkpoint"]).resolve() == model_path]
    if not records:
        raise SystemExit(f"no train record for {model_path} in {args.results_file}")
    record = records[-1]
    committed = f"checkpoints/{args.name}.pt"
    evaluations = [r for r in read_records(args.results_file)
                   if r.get("kind") == "evaluate" and r["checkpoint"].endswith(committed)]
    tested = evaluations[-1] if evaluations else record
    series = read_metrics(args.run_dir)
    page = Page(args.out / args.name)

    config = record["config"]
    summary = {
        "name": args.name,
        "command": args.command,
        "machine": record["machine"],
        "train_time_s": record["train_time_s"],
        "steps": record["global_step"],
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
    sampler, model = tested["sampler"], config["model"]
    task = {k: v for k, v in config["task"].items() if k not in ("_target_", "cache_dir")}
    facts = [
        [f"test accuracy (full-step: Top-{sampler['k']}, {sampler['ordering']} ordering, EMA weights)",
         f"**{tested['accuracy']:.1%}** on {tested['n']} held-out examples"],
        ["NFE per sample",
         f"mean {tested['nfe_mean']:.2f}, min {tested['nfe']['min']}, max {tested['nfe']['max']}"],
        ["training", (f"{record['global_step']} steps, batch {config['data']['batch_size']}, "
                      f"{record['train_time_s'] / 60:.1f} min on {record['machine']}")],
        ["model", f"{model['n_layers']} layers, d_model {model['d_model']}, {model['positions']} positions"],
        ["task", f"`{json.dumps(task)}`"],
    ]
    numbers = page.name(".json")
    markdown = [
        f"# {args.name}", "",
        f"Trained by `{args.command}` on {record['machine']} ({record['time']}); tested on {tested['machine']}.",
        "", markdown_table(["", ""], facts), "",
        f"![training curve]({page.name('.png')})", "",
        f"Numbers: [`{numbers}`]({numbers}). Evaluate the committed checkpoint again with",
        f"`python evaluate.py ckpt=checkpoints/{args.name}.pt`.",
        args.notes,
    ]
    written = page.write(figure=figure(series, args.name), data=summary, markdown=markdown)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

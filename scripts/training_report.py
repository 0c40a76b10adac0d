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

from mdmkit.io.results import read_records  # noqa: E402


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                for key, value in row.items():
                    if key not in ("step", "epoch") and value not in ("", None):
                        series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def plot(series: dict[str, list[tuple[int, float]]], title: str, path: Path) -> None:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True, help="page name under docs/results/")
    parser.add_argument("--command", required=True, help="the command that produced the run")
    parser.add_argument("--results-file", type=Path, default=Path("results/evaluations.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--notes", default="", help="extra markdown appended to the page")
    args = parser.parse_args()

    model_path = str(args.run_dir / "model.pt")
    records = [r for r in read_records(args.results_file) if r.get("kind") == "train" and r["checkpoint"] == model_path]
    if not records:
        raise SystemExit(f"no train record for {model_path} in {args.results_file}")
    record = records[-1]
    committed = f"checkpoints/{args.name}.pt"
    evaluations = [r for r in read_records(args.results_file)
                   if r.get("kind") == "evaluate" and r["checkpoint"].endswith(committed)]
    tested = evaluations[-1] if evaluations else record
    series = read_metrics(args.run_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(series, args.name, args.out / f"{args.name}.png")

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
    (args.out / f"{args.name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    sampler = tested["sampler"]
    page = f"""# {args.name}

Trained by `{args.command}` on {record['machine']} ({record['time']}); tested on {tested['machine']}.

| | |
|---|---|
| test accuracy (full-step: Top-{sampler['k']}, {sampler['ordering']} ordering, EMA weights) | **{tested['accuracy']:.1%}** on {tested['n']} held-out examples |
| NFE per sample | mean {tested['nfe_mean']:.2f}, min {tested['nfe']['min']}, max {tested['nfe']['max']} |
| training | {record['global_step']} steps, batch {config['data']['batch_size']}, {record['train_time_s'] / 60:.1f} min on {record['machine']} |
| model | {config['model']['n_layers']} layers, d_model {config['model']['d_model']}, {config['model']['positions']} positions |
| task | `{json.dumps({k: v for k, v in config['task'].items() if k not in ('_target_', 'cache_dir')})}` |

![training curve]({args.name}.png)

Numbers: [`{args.name}.json`]({args.name}.json). Evaluate the committed checkpoint again with
`python evaluate.py ckpt=checkpoints/{args.name}.pt`.
{args.notes}
"""
    (args.out / f"{args.name}.md").write_text(page)
    print(f"wrote {args.out / args.name}.{{md,json,png}}")


if __name__ == "__main__":
    main()

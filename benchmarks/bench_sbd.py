"""Set Block Decoding on the arithmetic task: forwards per token and wall-clock speed against NTP decoding.

    python -m benchmarks.bench_sbd                          # train all three models, then measure (CPU: ~1 h)
    python -m benchmarks.bench_sbd --ntp PATH/model.pt      # reuse an NTP model; fine-tune (a) and (b) from it
    python -m benchmarks.bench_sbd --ntp A --ntp-ft B --sbd C   # measure only
    python -m benchmarks.bench_sbd --quick                  # smoke run (tiny training, 64 test problems)

Protocol (issue 6): an NTP model is trained on `task=arithmetic`; from it, (a) NTP-only and (b) SBD fine-tunes
run with identical data, steps and optimiser (`experiment=arithmetic_ntp_finetune` / `arithmetic_sbd`). On the
test split we report accuracy on the final answer, forwards per generated token (NFE up to and including the
end token, divided by the tokens up to it), and the speedup in forwards over NTP decoding of (a); for (b) with
NTP decoding (its NTP head) and with SBD over a gamma grid of the EB rule, at two block sizes. Wall-clock
tokens/s of cached NTP decoding vs SBD are measured side by side in this one process, alternating the two
several times on the same test problems and batch, and reported as the median ratio.

Results: docs/results/sbd_arithmetic.{jsonl,md,png}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp
from mdmkit.analysis.stats import wilson_interval
from mdmkit.evaluation.runner import sample_split
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import EBSampler, NTPDecoder, SBDSampler
from mdmkit.tasks.arithmetic import END, VOCAB

ROOT = Path(__file__).resolve().parents[1]
GAMMAS = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.35, 0.6, 1.0, 2.0, 4.0]
BLOCKS = [8, 16]


def train(experiment: str, out: Path, steps: int, extra: list[str]) -> Path:
    """Run train.py (logging to out/train.log) unless out/model.pt exists; returns the model file."""
    model = out / "model.pt"
    if model.exists():
        print(f"reusing {model}")
        return model
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "train.py"), f"experiment={experiment}",
               f"trainer.max_steps={steps}", "logger=csv", "evaluate_after_training=false",
               f"hydra.run.dir={out}", *extra]
    print("running:", " ".join(command[1:]))
    with open(out / "train.log", "w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"training failed; see {out / 'train.log'}")
    return model


def sbd_sampler(block: int, gamma: float) -> SBDSampler:
    """The paper's SBD inference: EB (entropy ordering) inside blocks of `block` masks."""
    return SBDSampler(block_size=block, rule=EBSampler(gamma=gamma, ordering="entropy"))


def generated_tokens(predictions: torch.Tensor, answer_mask: torch.Tensor) -> np.ndarray:
    """Answer tokens up to and including the first end token (all answer tokens when there is none)."""
    end = VOCAB.index(END)
    counts = []
    for row, answer in zip(predictions, answer_mask):
        region = row[answer]
        hits = (region == end).nonzero()
        counts.append(int(hits[0]) + 1 if len(hits) else len(region))
    return np.array(counts)


def measure(name: str, network: torch.nn.Module, task, test, sampler, batch_size: int) -> dict[str, Any]:
    result = sample_split(network, task, test, sampler, batch_size=batch_size, seed=0)
    tokens = generated_tokens(result.predictions, test.answer_mask)
    correct = int(result.correct.sum())
    row = {
        "name": name, "sampler": repr(sampler), "n": len(result.correct), "accuracy": result.accuracy,
        "accuracy_ci95": list(wilson_interval(correct, len(result.correct))),
        "nfe_mean": float(result.nfe.mean()), "tokens_mean": float(tokens.mean()),
        "forwards_per_token": float(result.nfe.sum() / tokens.sum()),
        "wall_time_s": result.wall_time_s, "tokens_per_s": float(tokens.sum() / result.wall_time_s),
    }
    print(f"{name:<34} accuracy {row['accuracy']:.4f}  forwards/token {row['forwards_per_token']:.3f}  "
          f"NFE {row['nfe_mean']:.2f}  tokens {row['tokens_mean']:.2f}  {row['tokens_per_s']:.0f} tok/s")
    return row


def wall_clock(ntp_net, sbd_net, sampler, task, test, batch_size: int, repeats: int) -> dict[str, Any]:
    """Tokens/s of cached NTP decoding (model a) vs SBD (model b), alternated on the same problems."""
    ntp_rates, sbd_rates = [], []
    for network, decoder in ((ntp_net, NTPDecoder()), (sbd_net, sampler)):  # warm-up, not timed
        sample_split(network, task, test.head(min(len(test), batch_size)), decoder, batch_size=batch_size)
    for _ in range(repeats):
        pairs = ((ntp_net, NTPDecoder(), ntp_rates), (sbd_net, sampler, sbd_rates))
        for network, decoder, rates in pairs:
            result = sample_split(network, task, test, decoder, batch_size=batch_size, seed=0)
            tokens = generated_tokens(result.predictions, test.answer_mask).sum()
            rates.append(float(tokens / result.wall_time_s))
    ratios = [s / n for s, n in zip(sbd_rates, ntp_rates)]
    return {"ntp_tokens_per_s": ntp_rates, "sbd_tokens_per_s": sbd_rates,
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios), "speedup_max": max(ratios), "sbd_sampler": repr(sampler),
            "batch_size": batch_size, "repeats": repeats, "threads": torch.get_num_threads()}


def figure(rows: list[dict[str, Any]]) -> plt.Figure:
    """Accuracy against forwards per token: each block size's gamma grid as a line, the NTP rows as markers."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=130)
    for block in BLOCKS:
        points = sorted((r for r in rows if r.get("block") == block), key=lambda r: r["forwards_per_token"])
        ax.plot([r["forwards_per_token"] for r in points], [100 * r["accuracy"] for r in points], "o-",
                label=f"SBD k={block}, EB gamma grid")
    for row, marker in zip([r for r in rows if r.get("block") is None], ("s", "^")):
        ax.plot(row["forwards_per_token"], 100 * row["accuracy"], marker, markersize=9, label=row["name"])
    ax.set_xlabel("forwards per generated token")
    ax.set_ylabel("accuracy on the final answer (%)")
    ax.set_title("Set Block Decoding on arithmetic (CPU models)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def markdown(rows: list[dict], walls: list[dict], meta: dict, notes: str, page: Page) -> str:
    ntp = next(r for r in rows if r["name"] == "(a) NTP fine-tune, NTP decoding")
    lines = [
        "# Set Block Decoding on the arithmetic task", "",
        (f"Reproduce: `{meta['command']}` ({meta['device']}, {meta['threads']} threads; commit "
         f"{meta['git_commit']}). Raw rows: `{page.name('.jsonl')}`; plot: `{page.name('.png')}`."), "",
        (f"Models: {meta['models']}. Test: {ntp['n']} problems of `task=arithmetic` (defaults: 3 operations "
         "on 0-9, left to right, chain of thought), scored on the final answer. Forwards per token = NFE up "
         "to and including the end token / tokens up to it (the prompt is prefilled in the first forward). "
         "Speedup = NTP forwards per token / this row's."), "",
        markdown_table(["model, decoding", "accuracy (95% CI)", "forwards / token", "speedup", "NFE", "tokens"],
                       [accuracy_cells(r, ntp) for r in rows], align="lrrrrr"),
        "", ("Wall clock: tokens per second of SBD (model b) over cached NTP decoding (model a), side by side "
             "in one process on the same problems, alternating the two (median over repeats, after a warm-up):"),
        "", markdown_table(["SBD setting", "accuracy kept", "batch", "problems", "SBD / NTP tokens per second",
                        "range"], [wall_clock_cells(wall) for wall in walls], align="lrrrrr"),
    ]
    if walls:
        lines += ["", f"{walls[0]['repeats']} repeats, {walls[0]['threads']} threads."]
    else:
        lines += ["", "No SBD setting came within 2 points of NTP accuracy, so no wall-clock pair was timed."]
    return "\n".join([*lines, "", notes])


def accuracy_cells(row: dict, ntp: dict) -> list[str]:
    low, high = row["accuracy_ci95"]
    speedup = ntp["forwards_per_token"] / row["forwards_per_token"]
    return [row["name"], f"{100 * row['accuracy']:.1f}% ({100 * low:.1f}-{100 * high:.1f})",
            f"{row['forwards_per_token']:.3f}", f"{speedup:.2f}x", f"{row['nfe_mean']:.2f}",
            f"{row['tokens_mean']:.2f}"]


def wall_clock_cells(wall: dict) -> list[str]:
    return [wall["chosen"], f"within {wall['within_points']} point(s) of NTP", str(wall["batch_size"]),
            str(wall["problems"]), f"**{wall['speedup_median']:.2f}x**",
            f"{wall['speedup_min']:.2f}-{wall['speedup_max']:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ntp", type=Path, help="an NTP model.pt (default: train one)")
    parser.add_argument("--ntp-ft", type=Path, help="the NTP fine-tune (a) (default: train it)")
    parser.add_argument("--sbd", type=Path, help="the SBD fine-tune (b) (default: train it)")
    parser.add_argument("--work", type=Path, default=Path("outputs/bench_sbd"), help="training outputs")
    parser.add_argument("--pretrain-steps", type=int, default=6000)
    parser.add_argument("--finetune-steps", type=int, default=4000)
    parser.add_argument("--limit", type=positive_int, default=None, help="test problems (default: all 1000)")
    parser.add_argument("--batch-size", type=positive_int, default=250)
    parser.add_argument("--repeats", type=positive_int, default=5, help="wall-clock alternations")
    parser.add_argument("--single-problems", type=positive_int, default=100, help="problems timed at batch size 1")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results",
                        help="folder of the page sbd_arithmetic.{jsonl,md,png}")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny training, 64 problems")
    parser.add_argument("--notes", type=Path, help="markdown appended to the page (the analysis)")
    args = parser.parse_args()
    if args.quick:
        args.pretrain_steps, args.finetune_steps, args.limit, args.repeats = 60, 40, 64, 2
        args.single_problems = 8
        args.work = args.work.with_name(args.work.name + "_quick")
        args.out = args.work.with_name("quick_results")
    for given in (args.ntp, args.ntp_ft, args.sbd):  # named models are read before hours of training and timing
        if given is not None and not given.is_file():
            parser.error(f"no such model: {given}")
    torch.set_num_threads(int(os.environ.get("MDMKIT_THREADS", "2")))
    torch.manual_seed(0)

    ntp = args.ntp or train("arithmetic_ntp", args.work / "ntp", args.pretrain_steps, [])
    common = [f"init_from={ntp.resolve()}"]
    ntp_ft = args.ntp_ft or train("arithmetic_ntp_finetune", args.work / "ntp_finetune", args.finetune_steps,
                                  common)
    sbd = args.sbd or train("arithmetic_sbd", args.work / "sbd", args.finetune_steps, common)

    models = {name: TrainedModel(path) for name, path in (("ntp_ft", ntp_ft), ("sbd", sbd))}
    task = models["sbd"].task
    test = task.load_test().head(args.limit)
    nets = {name: model.network(task) for name, model in models.items()}
    rows = [
        measure("(a) NTP fine-tune, NTP decoding", nets["ntp_ft"], task, test, NTPDecoder(), args.batch_size),
        measure("(b) SBD fine-tune, NTP decoding", nets["sbd"], task, test, NTPDecoder(), args.batch_size),
    ]
    for block in BLOCKS:
        for gamma in GAMMAS:
            name = f"(b) SBD k={block}, EB gamma={gamma}"
            row = measure(name, nets["sbd"], task, test, sbd_sampler(block, gamma), args.batch_size)
            rows.append({**row, "block": block, "gamma": gamma})

    # wall clock: the fewest-forwards SBD setting within 1 point of NTP accuracy, and within 2 points
    ntp_accuracy, walls = rows[0]["accuracy"], []
    for points in (1, 2):
        close = [r for r in rows if r.get("block") and r["accuracy"] >= ntp_accuracy - points / 100]
        if not close:
            continue
        chosen = min(close, key=lambda r: r["forwards_per_token"])
        sampler = sbd_sampler(chosen["block"], chosen["gamma"])
        # a full batch (compute-bound on a CPU) and single problems (latency-bound, as decoding on a GPU is)
        for batch, problems in ((args.batch_size, test), (1, test.head(args.single_problems))):
            wall = wall_clock(nets["ntp_ft"], nets["sbd"], sampler, task, problems, batch, args.repeats)
            walls.append({**wall, "chosen": chosen["name"], "within_points": points,
                          "problems": len(problems)})
            print(f"wall clock within {points} point(s), batch {batch}: SBD / NTP tokens per second = "
                  f"{wall['speedup_median']:.2f}x ({chosen['name']})")

    page = Page(args.out / "sbd_arithmetic")
    meta = {"command": command_line(__file__, sys.argv[1:]), **stamp(), "device": "CPU",
            "threads": torch.get_num_threads(),
            "models": {"ntp": str(ntp), "ntp_finetune": str(ntp_ft), "sbd": str(sbd)},
            "pretrain_steps": args.pretrain_steps, "finetune_steps": args.finetune_steps}
    notes = args.notes.read_text() if args.notes else ""
    written = page.write(rows=[*({**row, "meta": meta} for row in rows),
                               *({"name": "wall_clock", **wall, "meta": meta} for wall in walls)],
                         figure=figure(rows), markdown=markdown(rows, walls, meta, notes, page))
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    run_script(main, "bench_sbd.py")

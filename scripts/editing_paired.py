"""A base sampler and the same base under token editing on the same test examples: which examples editing gains and
which it loses, with a sign test.

    python scripts/editing_paired.py checkpoints/sudoku_paper.pt --limit 200 --base threshold tau=0.9 \
        --threshold 0.5 --post-steps 0

A results row holds an accuracy, not which examples were solved, so two rows can only be compared through their
intervals. Here both runs are sampled again on the same examples (greedy: the same tokens a results row's run
makes), and an exact sign test over the examples they disagree on says how likely a split this uneven would be
were editing neither better nor worse.
"""

from __future__ import annotations

import argparse

import numpy as np

from mdmkit.analysis.pages import run_script
from mdmkit.analysis.stats import sign_test
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.runner import sample_split
from mdmkit.evaluation.sweep import sampler_preset
from mdmkit.io.checkpoint import TrainedModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="a trained mdmkit checkpoint on a puzzle task")
    parser.add_argument("--limit", type=int, default=200, help="first N test examples")
    parser.add_argument("--base", nargs="+", required=True, metavar="OPTION [FIELD=VALUE ...]",
                        help="the base sampler: a conf/sampler option and its fields, e.g. threshold tau=0.9")
    parser.add_argument("--threshold", type=float, nargs="+", required=True, help="editing thresholds")
    parser.add_argument("--post-steps", type=int, default=0, help="post steps of the editing runs")
    parser.add_argument("--batch-size", type=int, default=256)
    return parser.parse_args(argv)


def value(text: str) -> object:
    """A field's value from the command line: a number where it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text, text)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    option, *fields = args.base
    base = {**sampler_preset(option), **{k: value(v) for k, v in (f.split("=", 1) for f in fields)}}
    trained = TrainedModel(args.ckpt)
    task = trained.task
    network = trained.network(task).eval()
    test = task.load_test().head(args.limit)

    def run(config: dict) -> tuple[np.ndarray, float]:
        result = sample_split(network, task, test, build_sampler(config, network), args.batch_size, 0)
        assert result is not None  # one process: it is the main rank
        return result.correct, float(result.nfe.mean())

    plain, plain_nfe = run(base)
    print(f"base {option} {' '.join(fields)}: {plain.mean():.1%} at {plain_nfe:.2f} NFE on {len(plain)} examples")
    print("| editing threshold | post steps | accuracy | NFE | gained | lost | sign test p |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for threshold in args.threshold:
        edited, nfe = run({"_target_": "mdmkit.samplers.EditingSampler", "threshold": threshold,
                           "post_steps": args.post_steps, "base": base})
        gained, lost = int((edited & ~plain).sum()), int((plain & ~edited).sum())
        print(f"| {threshold:g} | {args.post_steps} | {edited.mean():.1%} | {nfe:.2f} | {gained} | {lost} | "
              f"{sign_test(gained, lost):.3g} |")


if __name__ == "__main__":
    run_script(main, "editing_paired.py")

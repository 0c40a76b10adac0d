"""Sampler overhead per step on text models, as a share of one forward at batch 8.

Written to `docs/results/sampler_overhead_text.*`.

    python -m benchmarks.bench_text_overhead                     # every text network, 3 trials
    python -m benchmarks.bench_text_overhead --networks bert-gsm8k --trials 1 --steps 3 --out /tmp/quick

Goal (issue 17): the sampler's own work per step <= 3% of one forward at batch 8. Method in
`benchmarks.overhead_text`: real runs behind a clock, the loop's time being the gaps between forwards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.overhead_text import TEXT_NETWORKS, TEXT_RULES, run_text_overhead
from benchmarks.overhead_text_page import text_overhead_record, write_text_overhead_page
from mdmkit.analysis.pages import Page, command_line


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", default=",".join(TEXT_NETWORKS),
                        help=f"comma-separated, of: {', '.join(TEXT_NETWORKS)} (default: all)")
    parser.add_argument("--rules", default=",".join(TEXT_RULES), help="comma-separated rule names (default: all)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="steps timed per run (default %(default)s)")
    parser.add_argument("--trials", type=int, default=3, help="runs per (network, rule) (default %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sampler_overhead_text"),
                        help="output prefix: writes <out>.json, <out>.png, <out>.md (default %(default)s)")
    parser.add_argument("--note", default="", help="a line added to the markdown (e.g. conditions of the run)")
    args = parser.parse_args(argv)
    for kind, names, known in (("network", args.networks, TEXT_NETWORKS), ("rule", args.rules, TEXT_RULES)):
        unknown = [name for name in names.split(",") if name not in known]
        if unknown:
            parser.error(f"unknown {kind}(s) {unknown}; known: {', '.join(known)}")
    if min(args.batch_size, args.steps, args.trials, args.threads) < 1:
        parser.error("--batch-size, --steps, --trials and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rules = {name: TEXT_RULES[name] for name in args.rules.split(",")}
    cases = []
    for name in args.networks.split(","):
        cases += run_text_overhead(TEXT_NETWORKS[name], rules, args.batch_size, args.steps, args.trials)
    record = text_overhead_record(cases, command=command_line(__file__, argv), batch_size=args.batch_size,
                                  steps=args.steps, note=args.note)
    written = write_text_overhead_page(Page(args.out), record)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

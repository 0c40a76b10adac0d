"""Sampler overhead per step, excluding the network forward, as a share of one forward of the CPU model.

    python -m benchmarks.bench_sampler_overhead                # full run, writes docs/results/sampler_overhead.*
    python -m benchmarks.bench_sampler_overhead --quick        # smoke run (few trials, two orderings)

Goal (from the issue): one step of `MaskedSampler.sample` minus the network costs <= 3% of one forward of the
CPU-default Sudoku model (4 layers, d_model 128) at batch 256, float32, 2 torch threads.

Method (`benchmarks.overhead`): each configuration's real trajectory is recorded once, then the sampler
is timed with the network replaced by a lookup of the recorded logits, interleaved with forward timings in
every trial; the page gives the median over trials and the min-max spread. `overhead_profile` says where the
time goes, `overhead_page` writes the page and its interpretation. The network is --checkpoint, by default
the trained `checkpoints/sudoku_mdm.pt` if present, else a randomly initialised CPU-default model: the
forward time does not depend on the weights, but the steps the data-dependent rules take do, so the page
names which network produced the logits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.overhead import (
    ORDERINGS,
    OWN_RULES,
    RULES,
    Case,
    load_network,
    prompts,
    record_cases,
    time_forward,
    time_trials,
)
from benchmarks.overhead_page import overhead_record, write_overhead_page
from benchmarks.overhead_profile import components, profile_case
from mdmkit.analysis.pages import Page, command_line
from mdmkit.tasks.sudoku import SudokuTask

DEFAULT_CHECKPOINT = Path("checkpoints/sudoku_mdm.pt")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=None, help="trials (default 9; --quick: 2)")
    parser.add_argument("--forward-reps", type=int, default=None,
                        help="forwards timed per trial (default 15; --quick: 3)")
    parser.add_argument("--sampler-reps", type=int, default=3,
                        help="replayed runs per configuration per trial (median)")
    parser.add_argument("--masked", type=int, default=45, help="blank cells per puzzle")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help=f"the network (default: {DEFAULT_CHECKPOINT} if it exists, else random init)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/sampler_overhead"),
                        help="output prefix: writes <out>.json, <out>.png, <out>.md (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 trials, confidence and entropy only")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-operator profile")
    parser.add_argument("--note", default="",
                        help="a line added to the markdown (e.g. conditions of the run)")
    args = parser.parse_args(argv)
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint} does not exist")
    if args.checkpoint is None and DEFAULT_CHECKPOINT.is_file():
        args.checkpoint = DEFAULT_CHECKPOINT
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 9)
    forward_reps = args.forward_reps or (3 if args.quick else 15)
    orderings = ORDERINGS[:2] if args.quick else ORDERINGS

    torch.set_num_threads(args.threads)
    task = SudokuTask()
    network, source = load_network(args.checkpoint, task)
    parameters = sum(p.numel() for p in network.parameters())
    x = prompts(args.batch_size, args.masked, args.seed, task.mask_id)
    print(f"network: {source} ({parameters:,} parameters); batch {tuple(x.shape)}, {args.masked} masked per "
          f"row; {torch.get_num_threads()} threads", flush=True)

    for _ in range(5):  # warm-up
        time_forward(network, x, 1)
    cases = [Case(rule, ordering, make(ordering)) for rule, make in RULES.items() for ordering in orderings]
    cases += [Case(rule, ordering, make()) for rule, (ordering, make) in OWN_RULES.items()]
    record_cases(cases, network, x, task, args.seed)
    forward = time_trials(cases, network, x, task.mask_id, trials=repeats, forward_reps=forward_reps,
                          sampler_reps=args.sampler_reps, seed=args.seed)
    if not args.no_profile:
        for case in cases:
            profile_case(case, x, task.mask_id, task.vocab_size, args.seed)
    parts = components(cases[0].logits[0], task.mask_id, forward_reps * 4)

    record = overhead_record(cases, forward, parts, command=command_line(__file__, argv), network=source,
                             parameters=parameters, batch_size=args.batch_size, masked_per_row=args.masked,
                             note=args.note)
    written = write_overhead_page(Page(args.out), record)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

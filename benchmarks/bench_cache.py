"""Approximate KV caches for masked diffusion (`cache=none|prefix|dual`): accuracy cost and wall clock per token.

    python -m benchmarks.bench_cache --checkpoint outputs/arithmetic_mdm/<run>/model.pt --run-accuracy   # everything
    python -m benchmarks.bench_cache --skip-speed      # re-make the page from kv_cache.jsonl, keep the timed numbers
    python -m benchmarks.bench_cache --quick --out /tmp/kv_cache   # smoke run: tiny network, no accuracy commands

Accuracy: an MDM trained on the arithmetic task (`python train.py experiment=arithmetic_mdm`; prompt, then a
chain of thought) sampled in semi-AR blocks by threshold, EB and Top-k samplers, each with cache none, prefix and
dual. The rows come from `evaluate.py` Hydra multiruns appending to `<out>.jsonl`; `--run-accuracy` runs them
(rows already there are skipped), and the page names them either way.

Speed (`benchmarks.kv_cache_speed`): wall clock per generated token of the three modes side by side in one
process, at equal NFE (a fixed-steps sampler), on a random-weight LLaDA-architecture `DiffusionLM`, batch 1
and 8. The page is written by `benchmarks.kv_cache_page`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.kv_cache_page import accuracy_entries, kv_cache_page, write_kv_cache_page
from benchmarks.kv_cache_speed import (
    SpeedSetup,
    llada_like,
    random_network,
    run_speed,
    speed_record,
    summarize,
)
from mdmkit.analysis.pages import ROOT, Page, command_line
from mdmkit.analysis.pareto import load_rows

# (sampler option, its knob, values): a couple of settings each, every one with cache none, prefix and dual
GRIDS = (("threshold", "tau", "0.9,0.7"), ("eb", "gamma", "0.01,0.1"), ("topk", "k", "1,2"))
QUICK = {"d_model": 32, "n_layers": 2, "n_heads": 2, "mlp_hidden": 64, "vocab_size": 64}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/kv_cache"),
                        help="output prefix: <out>.md/.json/.png; accuracy rows in <out>.jsonl (default %(default)s)")
    parser.add_argument("--checkpoint", default=None,
                        help="the arithmetic MDM (model.pt) whose evaluate.py commands the page names")
    parser.add_argument("--block-lengths", type=int, nargs="+", default=[8, 16],
                        help="semi-AR blocks over the 32 answer positions (accuracy)")
    parser.add_argument("--run-accuracy", action="store_true",
                        help="run the evaluate.py commands first (needs --checkpoint)")
    parser.add_argument("--skip-speed", action="store_true", help="keep the speed numbers of the existing <out>.json")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-layers", type=int, default=6)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--mlp-hidden", type=int, default=1536)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--answer", type=int, default=256)
    parser.add_argument("--block", type=int, default=32, help="semi-AR block (speed)")
    parser.add_argument("--steps-per-block", type=int, default=8, help="forwards per block in every mode")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (speed)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="network dtype for the speed run (default: float32 on a CPU, bfloat16 on a GPU)")
    parser.add_argument("--goal", type=float, default=None,
                        help="dual / none per-token speed-up asked for (default: 2 on a CPU, 3 on a GPU)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a tiny network, prompt 24 + answer 8, block 4, 2 steps, batch 1 and 2")
    parser.add_argument("--note", action="append", default=[], help="a line added under Notes (repeatable)")
    args = parser.parse_args(argv)
    if args.run_accuracy and args.checkpoint is None:
        parser.error("--run-accuracy needs --checkpoint")
    if args.skip_speed and not args.out.with_name(args.out.name + ".json").is_file():
        parser.error(f"--skip-speed: {args.out}.json does not exist")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    gpu = args.device != "cpu"
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.goal = args.goal if args.goal is not None else (3.0 if gpu else 2.0)
    return args


def accuracy_commands(checkpoint: str, block_lengths: list[int], results: Path) -> list[list[str]]:
    return [["python", "evaluate.py", "-m", f"ckpt={checkpoint}", f"sampler={name}", f"sampler.{knob}={values}",
             f"sampler.block_length={','.join(map(str, block_lengths))}", "sampler.cache=none,prefix,dual",
             f"results_file={results}", "wandb.mode=disabled"] for name, knob, values in GRIDS]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    page, command = Page(args.out), command_line(__file__, argv)
    results = page.file(".jsonl")
    shown = results.resolve().relative_to(ROOT) if results.resolve().is_relative_to(ROOT) else results
    commands = [] if args.checkpoint is None else accuracy_commands(args.checkpoint, args.block_lengths, shown)
    if args.run_accuracy:
        for line in commands:
            print("$ " + shlex.join(line), flush=True)
            subprocess.run([sys.executable, *line[1:]], cwd=ROOT, check=True)

    rows = load_rows([results]) if results.is_file() else []
    accuracy = accuracy_entries(rows)
    previous = json.loads(page.file(".json").read_text()) if page.file(".json").is_file() else {}
    if not commands:  # the page keeps naming the commands that made its rows
        commands = [shlex.split(c) for c in previous.get("accuracy", {}).get("commands", [])]
    models = ", ".join(sorted({f"`{e['checkpoint']}` (sha {str(e['checkpoint_sha'])[:12]})" for e in accuracy}))
    description = (f"Model: {models}, the 0.8M-parameter CPU model trained with "
                   "`python train.py experiment=arithmetic_mdm`. Test: the arithmetic task's 1000 problems (3 "
                   "operations on 0-9, left to right: a prompt such as `8*6+5+2:`, then 32 answer positions for "
                   "the chain of thought, `#`, the result and `$` padding), scored on the final answer. NFE and "
                   "computed tokens per example are counted up to the end token "
                   "`$` (rows stop early once it is settled).")
    source = {"results_file": str(shown), "commands": [shlex.join(c) for c in commands],
              "description": [description] if accuracy else []}

    if args.skip_speed:  # the timed numbers, with the command and date of the run that timed them
        speed = previous.get("speed")
        if speed is not None:
            speed = {"command": previous.get("command"), "date": previous.get("date"), **speed}
    else:
        shape = QUICK if args.quick else {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                                          "mlp_hidden": args.mlp_hidden, "vocab_size": args.vocab_size}
        setup = (SpeedSetup(prompt=24, answer=8, block_length=4, steps_per_block=2, batches=(1, 2), repeats=1)
                 if args.quick else SpeedSetup(args.prompt, args.answer, args.block, args.steps_per_block,
                                               tuple(args.batches), args.repeats))
        setup = dataclasses.replace(setup, device=args.device, dtype=args.dtype)
        network = random_network(llada_like(**shape), device=args.device, dtype=args.dtype)
        print(f"speed: {network.num_parameters() / 1e6:.1f}M parameters, {torch.get_num_threads()} threads, "
              f"{setup}", flush=True)
        speed = speed_record(network, setup, summarize(run_speed(network, setup), setup), command)

    md, record = kv_cache_page(page, command=command, accuracy=accuracy, accuracy_source=source,
                               speed=speed, goal=args.goal, notes=args.note)
    written = write_kv_cache_page(page, md, record, accuracy, speed)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()

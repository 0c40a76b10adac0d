"""NI sampling end to end for one base checkpoint: trajectories -> indicator training -> evaluation.

    python scripts/ni_pipeline.py --experiment sudoku_indicator --out outputs/ni/sudoku \
        [--checkpoint checkpoints/sudoku_mdm.pt] [--epsilons 0.5 0.8 0.9 0.95 0.99] [--taus 0.9 0.95]
        [--limit 1000] [--device auto] [--threads N] [--indicator PATH] [--eval OVERRIDE ...]
        [-- OVERRIDE ...]

OVERRIDEs (after `--`) are Hydra overrides of the training run, e.g. `-- trajectories.n_examples=2000
trainer.max_steps=500 logger=csv`. The steps:

1. the run of `train.py experiment=<experiment>`: records the base sampler's trajectories (sharded, resumable,
   cached under `trajectories.root`) and trains the indicator -> <out>/indicator.pt;
2. evaluate.py's sweep machinery on the test split: full-step top-1 with its oracle floor, threshold at each
   tau and NI (conf/sampler/ni.yaml, top-1 base) at each epsilon -> rows in <out>/results.jsonl and a plot,
   <out>/pareto.png;
3. the indicator's measured cost: the wall time of one indicator pass over that of one base forward, on a
   batch of fully masked test prompts (the NFE charge uses the parameter share; this checks it).

Prints the sweep table and writes <out>/summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from mdmkit.analysis.pareto_tables import runs_table
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import MdmkitError
from mdmkit.evaluation.evaluate import run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.indicator import load_indicator
from mdmkit.models.denoiser import without_mask
from mdmkit.models.indicator import IndicatorScorer, num_parameters
from mdmkit.training.indicator.train import run_indicator_training
from mdmkit.training.preflight import plan_training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="sudoku_indicator", help="an experiment=... of train.py")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--checkpoint", help="the base MDM (default: the experiment's one)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 0.8, 0.9, 0.95, 0.99])
    parser.add_argument("--taus", type=float, nargs="+", default=[0.9, 0.95])
    parser.add_argument("--limit", type=int, help="test examples (default: all)")
    parser.add_argument("--batch-size", type=int, default=256, help="evaluation batch size")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--indicator", type=Path, help="evaluate this trained indicator.pt (skips step 1)")
    parser.add_argument("--eval", nargs="+", default=[], metavar="OVERRIDE",
                        help="Hydra overrides of the evaluation only, e.g. a harder test set: task=sudoku "
                             "task.n_givens=26 task.n_train=1 task.n_val=1 (the generalisation check)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the training run")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> tuple[Path, str]:
    """Step 1; returns the indicator's path and its base checkpoint."""
    overrides = [f"experiment={args.experiment}", f"device={args.device}", "evaluate_after_training=false",
                 f"results_file={args.out / 'results.jsonl'}", f"trajectories.device={args.device}"]
    if args.checkpoint:
        overrides.append(f"trajectories.checkpoint={args.checkpoint}")
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, *args.overrides])
    summary = run_indicator_training(plan_training(cfg), args.out)
    print(f"indicator: {summary['global_step']} steps in {summary['train_time_s']:.0f} s")
    return args.out / "indicator.pt", cfg.trajectories.checkpoint


def evaluate(args: argparse.Namespace, indicator: Path, checkpoint: str) -> list[dict]:
    """Step 2: base, its oracle floor, threshold and NI on the same test examples."""
    overrides = [f"ckpt={checkpoint}", f"batch_size={args.batch_size}", f"device={args.device}",
                 f"results_file={args.out / 'results.jsonl'}", "wandb.mode=disabled"]
    if args.limit is not None:
        overrides.append(f"limit={args.limit}")
    overrides += args.eval
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        cfg = compose("evaluate", overrides=overrides)
    sweep = {"name": "ni", "entries": [
        {"sampler": "topk", "oracle": True},
        {"sampler": "threshold", "grid": {"tau": args.taus}},
        {"sampler": "ni", "grid": {"epsilon": args.epsilons, "indicator": [str(indicator)]}},
    ]}
    with open_dict(cfg):
        cfg.sweep = OmegaConf.create(sweep)
    return run_evaluation(plan_evaluation(cfg), args.out)


def measure_cost(args: argparse.Namespace, indicator: Path, checkpoint: str, repeats: int = 5) -> dict:
    """Step 3: seconds per base forward and per indicator pass on one batch of fully masked test prompts."""
    trained = TrainedModel(checkpoint)
    network = trained.network().to(resolve_device(args.device))
    task = trained.task
    test = task.load_test().head(args.batch_size)
    prompts = test.tokens.masked_fill(test.answer_mask, task.mask_id).to(network.embed.weight.device)
    loaded = load_indicator(indicator)
    loaded.check(network)
    scorer = IndicatorScorer(loaded.indicator.to(network.embed.weight.device), network.embed)
    masked = prompts == task.mask_id

    def seconds(run) -> float:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            if network.embed.weight.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if network.embed.weight.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    with torch.no_grad():
        logits, hidden = network.forward_with_hidden(prompts)
        logits = without_mask(logits, task.mask_id)
        forward = seconds(lambda: network(prompts))
        pass_ = seconds(lambda: scorer(masked, logits, hidden))
    return {"batch": len(prompts), "forward_s": forward, "indicator_s": pass_,
            "measured_share": pass_ / forward,
            "parameter_share": num_parameters(scorer.indicator) / num_parameters(network)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if args.indicator is not None:
            base = load_indicator(args.indicator).extra.get("base_checkpoint")
            indicator, checkpoint = args.indicator, args.checkpoint or base
        else:
            indicator, checkpoint = train(args)
        rows = evaluate(args, indicator, checkpoint)
        cost = measure_cost(args, indicator, checkpoint)
    except MdmkitError as error:
        print(f"ni_pipeline.py: error: {error}", file=sys.stderr)
        return 2
    print(runs_table(rows, cost=True))
    print(f"indicator cost per pass: {cost['measured_share']:.3f} of a base forward measured "
          f"({cost['indicator_s'] * 1e3:.2f} vs {cost['forward_s'] * 1e3:.2f} ms at batch {cost['batch']}), "
          f"{cost['parameter_share']:.3f} charged (parameter share)")
    keep = ("family", "params", "accuracy", "nfe_mean", "cost_mean", "extra_cost_mean", "n")
    summary = {"indicator": str(indicator), "checkpoint": checkpoint, "cost": cost,
               "rows": [{key: row.get(key) for key in keep} for row in rows]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

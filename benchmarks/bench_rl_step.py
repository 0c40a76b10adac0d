"""One RL step's time split into rollouts, scoring and updates, side by side in one run: the CPU Sudoku model and a
LLaDA-architecture network under LoRA, each with and without a reference model.

    python -m benchmarks.bench_rl_step --device cpu --out docs/results/rl_step_cpu
    python -m benchmarks.bench_rl_step --device cuda --sudoku none --llm llada-8b --llm-prompts 1 --llm-group 8 \
        --prompt-len 256 --gen-len 256 --out docs/results/rl_step_gpu     # tools/device/device_rl_step.sh

Where an RL step's time goes decides what to make faster: d1-style RL samples G rollouts of every prompt (tens to
hundreds of forwards each) and then makes mu inner updates (a forward and backward each), so the sampler's NFE per
rollout, which mdmkit counts, is the lever as long as rollouts dominate. Each case reports the median seconds of
the three parts over the timed steps, the NFE per rollout and rollouts / updates. See `benchmarks.rl_step` for the
step and how it is measured; a case that runs out of memory is recorded as such and the rest run.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.rl_step import Case, RandomPrompts, TokenParity, measure, random_prompts, rl_settings
from mdmkit.analysis.pages import Page, command_line, markdown_table, positive_int, run_script, stamp

SUDOKU_CASES = (("threshold", True), ("threshold", False), ("top-1", True))  # (rollout sampler, reference)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from benchmarks.llm_path import PRESETS as LLM_PRESETS
    from benchmarks.sft_step import PRESETS as SFT_PRESETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sudoku", default="checkpoints/sudoku_mdm.pt",
                        help="the Sudoku model's checkpoint ('none': no Sudoku cases)")
    parser.add_argument("--prompts", type=positive_int, default=8, help="Sudoku puzzles per step")
    parser.add_argument("--group", type=positive_int, default=8, help="Sudoku rollouts per puzzle (G)")
    parser.add_argument("--mu", type=positive_int, default=2, help="inner updates per batch of rollouts")
    parser.add_argument("--llm", default=None, choices=["none", *SFT_PRESETS, *LLM_PRESETS],
                        help="the LLaDA-architecture network's shape (default: tiny on a CPU, llada-8b on a GPU)")
    parser.add_argument("--llm-prompts", type=positive_int, default=2)
    parser.add_argument("--llm-group", type=positive_int, default=4)
    parser.add_argument("--prompt-len", type=positive_int, default=32)
    parser.add_argument("--gen-len", type=positive_int, default=64)
    parser.add_argument("--block", type=positive_int, default=32, help="the rollout sampler's block length")
    parser.add_argument("--k", type=positive_int, default=2, help="tokens revealed per forward (d1: 2)")
    parser.add_argument("--lora-r", type=positive_int, default=16)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the updates")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps per case (medians kept)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per case first")
    parser.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help="page prefix (default docs/results/rl_step_gpu on a GPU, rl_step_cpu on a CPU)")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    args.llm = args.llm or ("llada-8b" if gpu else "tiny")
    args.out = args.out or Path(f"docs/results/rl_step_{'gpu' if gpu else 'cpu'}")
    return args


def sudoku_cases(args: argparse.Namespace, device: torch.device) -> list[tuple[dict[str, Any], Any]]:
    """(keys, a function making the case) for the Sudoku model: `experiment=sudoku_rl`'s settings (threshold
    rollouts at temperature 1, d1's GRPO, the verifier's reward), with and without the reference, and top-1."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mdmkit.io.checkpoint import TrainedModel, build_task
    from mdmkit.samplers import TopKSampler
    from mdmkit.training.rl.plan import plan_rl
    from mdmkit.training.run_config import DataConfig

    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        config: Any = OmegaConf.to_container(compose("train", ["experiment=sudoku_rl"]), resolve=True)
    task = build_task(config)
    base, _ = plan_rl(config, DataConfig.from_config(config["data"]))
    examples = task.generate(args.prompts * (args.steps + args.warmup), seed=0)
    tokens = torch.as_tensor(examples.tokens, dtype=torch.long, device=device)
    answer_mask = torch.as_tensor(examples.answer_mask, dtype=torch.bool, device=device)
    made = []
    for sampler_name, reference in SUDOKU_CASES:
        sampler = base.sampler if sampler_name == "threshold" else TopKSampler(temperature=1.0)
        beta = base.loss.beta if reference else 0.0
        settings = rl_settings(base, sampler, args.group, args.mu, beta)

        def make(settings: Any = settings, name: str = "sudoku") -> Case:
            network = TrainedModel(args.sudoku).network(task).to(device).train()
            frozen = copy.deepcopy(network).requires_grad_(False) if settings.keeps_reference else None
            return Case(name, network, frozen, settings, task, tokens, answer_mask, args.prompts)

        keys = {"model": "sudoku", "sampler": sampler_name, "reference": reference, "prompts": args.prompts,
                "group": args.group, "mu": args.mu, "beta": beta}
        made.append((keys, make))
    return made


def llm_cases(args: argparse.Namespace, device: torch.device) -> list[tuple[dict[str, Any], Any]]:
    """(keys, a function making the case) for the random LLaDA-architecture network under LoRA, with the reference
    (the base, its adapters off, as `experiment=llada_rl` scores it) and without."""
    from benchmarks.llm_path import PRESETS as LLM_PRESETS
    from benchmarks.llm_path import random_llm
    from benchmarks.sft_step import PRESETS as SFT_PRESETS
    from mdmkit.models.llm.lora import LoRA, add_lora
    from mdmkit.objectives.rl import GRPOLoss
    from mdmkit.samplers import TopKSampler
    from mdmkit.training.rl.config import RLConfig
    from mdmkit.training.rl.text_module import BaseOf

    shape = {**LLM_PRESETS, **SFT_PRESETS}[args.llm]
    shape = replace(shape, max_positions=max(shape.max_positions, args.prompt_len + args.gen_len))
    bf16 = device.type == "cuda"
    count = args.llm_prompts * (args.steps + args.warmup)
    tokens, answer_mask = random_prompts(shape.vocab_size, shape.mask_id, count, args.prompt_len, args.gen_len,
                                         device)
    sampler = TopKSampler(k=args.k, temperature=1.0, block_length=min(args.block, args.gen_len))
    made = []
    for reference in (True, False):
        beta = GRPOLoss().beta if reference else 0.0
        settings = rl_settings(RLConfig(), sampler, args.llm_group, args.mu, beta, [("parity", TokenParity())])

        def make(settings: RLConfig = settings) -> Case:
            network = random_llm(shape, device, torch.bfloat16 if bf16 else torch.float32)
            network.gradient_checkpointing = args.checkpointing
            network = add_lora(network.train(), LoRA(args.lora_r))
            scorer = BaseOf(network) if settings.keeps_reference else None
            return Case(f"{args.llm}, LoRA r{args.lora_r}", network, scorer, settings, RandomPrompts(shape.mask_id),
                        tokens, answer_mask, args.llm_prompts, bf16=bf16)

        keys = {"model": args.llm, "sampler": f"top-{args.k}, blocks of {min(args.block, args.gen_len)}",
                "reference": reference, "prompts": args.llm_prompts, "group": args.llm_group, "mu": args.mu,
                "beta": beta, "prompt_len": args.prompt_len, "gen_len": args.gen_len, "lora_r": args.lora_r,
                "checkpointing": args.checkpointing, "dtype": "bf16" if bf16 else "float32"}
        made.append((keys, make))
    return made


def run_case(make: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    case = make()
    row = {"case": case.name, **measure(case, args.steps, args.warmup, lr=1e-5),
           "trained_parameters": sum(p.numel() for p in case.network.parameters() if p.requires_grad)}
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return row


def markdown(record: dict[str, Any], rows: list[dict[str, Any]], figure_name: str) -> list[str]:
    table = []
    for r in rows:
        reference = "yes" if r["reference"] else "no"
        shape = f"{r['prompts']} x {r['group']}"
        if "error" in r:
            table.append([r["model"], r["sampler"], reference, shape, r["mu"], r["error"], "", "", "", "", ""])
            continue
        table.append([r["case"], r["sampler"], reference, shape, r["mu"], f"{r['nfe']:.1f}", f"{r['rollout_s']:.3f}",
                      f"{r['scoring_s']:.3f}", f"{r['update_s']:.3f}", f"{r['rollout_over_update']:.2f}",
                      f"{r['step_s']:.3f}"])
    llm = next((r for r in rows if r["model"] != "sudoku"), None)
    lines = [
        f"# One RL step: rollouts, scoring and updates ({record['device']})", "",
        f"Made by `{record['command']}` on {record['date']} (commit {str(record.get('git_commit', ''))[:12]}).", "",
        ("A step is `experiment=<task>_rl`'s (mdmkit/training/rl/step.py): P prompts x G rollouts by the sampler "
         "(each rollout's forwards counted: NFE), then *scoring*: the rewards, the group advantages and the "
         "likelihood estimates the loss compares with (the old policy's for each of the mu inner updates when mu > "
         "1, the reference's where beta > 0), then the mu *updates* (d1's one-step estimate, GRPO's loss, backward, "
         "gradients clipped at 1, AdamW). Seconds: the median over "
         f"{record['setup']['steps']} timed steps after {record['setup']['warmup']} untimed, each part on its own; "
         "`rollout / update`: their ratio."), "",
        ("Sudoku: mdmkit's CPU model (checkpoints/sudoku_mdm.pt), `experiment=sudoku_rl`'s puzzles (30-36 givens), "
         "rollout sampler (threshold tau = 0.99 at temperature 1; top-1: one cell per forward), loss (beta = 0.04 "
         "with the reference, a frozen copy) and reward (the verifier)."),
    ]
    if llm is not None:
        lines += ["", (f"{llm['model']}: a LLaDA-architecture `DiffusionLM` with seeded random weights, LoRA r"
                       f"{llm['lora_r']} ({llm['dtype']}), random prompts of {llm['prompt_len']} tokens and "
                       f"{llm['gen_len']} to generate, {llm['sampler']} at temperature 1 (d1's rollout schedule); "
                       "the reference is the base with the adapters off; the reward a stand-in (the parity of the "
                       "completion's token sum: random weights solve nothing).")]
    load = f"The machine's 1-minute load average at the start: {record['load_average']:.1f} on {record['cpus']} CPUs."
    spread = [max(s[key] for s in r["steps"]) / min(s[key] for s in r["steps"]) for r in rows if "error" not in r
              for key in ("rollout_s", "update_s") if min(s[key] for s in r["steps"]) > 0]
    if spread:
        load += (f" From one timed step to the next a part's seconds varied by up to {max(spread):.1f}x (each step's "
                 "values are in the JSON): compare cases of one run, and read the ratios as rough.")
    lines += ["", load, "",
              markdown_table(["case", "rollout sampler", "reference", "P x G", "mu", "NFE / rollout", "rollout s",
                              "scoring s", "update s", "rollout / update", "step s"], table, "lllrrrrrrrr"), "",
              f"![seconds per part of a step]({figure_name})", ""]
    return lines


def figure(rows: list[dict[str, Any]], title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "error" not in r]
    fig, axis = plt.subplots(figsize=(9, 1.8 + 0.6 * max(1, len(done))), dpi=110)
    names = [f"{r['case']}\n{r['sampler']}, {'reference' if r['reference'] else 'no reference'}" for r in done]
    left = [0.0] * len(done)
    for key, label, colour in (("rollout_s", "rollouts", "#4c72b0"), ("scoring_s", "scoring", "#8da0cb"),
                               ("update_s", "updates", "#dd8452")):
        values = [r[key] / r["step_s"] for r in done]
        axis.barh(names, values, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, values)]
    for y, r in enumerate(done):
        axis.text(1.01, y, f"{r['step_s']:.2f} s, {r['nfe']:.0f} NFE", va="center", fontsize=8)
    axis.set(xlim=(0, 1.25), xlabel="share of a step's time", title=title)
    axis.invert_yaxis()
    axis.tick_params(axis="y", labelsize=8)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    record = {"command": command_line(__file__, argv), **stamp(), "device": name, "threads": torch.get_num_threads(),
              "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
              "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    cases = (sudoku_cases(args, device) if args.sudoku != "none" else []) + \
        (llm_cases(args, device) if args.llm != "none" else [])
    page, rows, started = Page(args.out), [], time.monotonic()
    for keys, make in cases:
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            rows.append({**keys, "error": f"not run (--budget-s {args.budget_s:g} spent)"})
        else:
            try:
                rows.append({**keys, **run_case(make, args, device)})
            except torch.OutOfMemoryError:
                rows.append({**keys, "error": "out of memory"})
            except ImportError as error:  # no peft (mdmkit's `sft` extra) where the LoRA cases run
                rows.append({**keys, "error": f"ImportError: {error}"})
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print({k: v for k, v in rows[-1].items() if k != "steps"}, flush=True)
        written = page.write(markdown=markdown(record, rows, page.name(".png")), data={**record, "rows": rows},
                             figure=figure(rows, f"One RL step: {name}"))  # after every case: a cut run keeps it
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    run_script(main, "bench_rl_step")

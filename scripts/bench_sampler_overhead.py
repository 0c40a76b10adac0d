"""Sampler overhead per step, excluding the network forward, as a share of one forward of the CPU-default model.

    python scripts/bench_sampler_overhead.py                # full run, writes docs/results/sampler_overhead.*
    python scripts/bench_sampler_overhead.py --quick        # smoke run (few trials, two orderings)

Goal (from the issue): one step of `MaskedSampler.sample` minus the network costs <= 3% of one forward of the
CPU-default Sudoku model (4 layers, d_model 128) at batch 256, float32, 2 torch threads.

Method: record-and-replay stub, not "full run minus forward time".
  1. Record. Each sampler configuration is run once with the real network wrapped in a recorder that keeps
     every logits tensor it returns. With temperature 0 and a seeded generator the loop is deterministic,
     so this is the exact trajectory a real evaluation takes: the real number of steps of the data-dependent
     rules (EB, threshold, factor) and the real shrinking of the batch as rows finish.
  2. Replay. The timed runs pass a stub "network" (inside the usual `ForwardCounter`) that returns the
     recorded logits of call i at call i, instantly. Wall time of `sampler.sample` is then pure sampler
     overhead (plus the counter's bookkeeping, which every evaluation pays too); divided by the number of
     network calls it is the overhead per step. The replayed run is checked to produce the recorded tokens.
  Why not subtract: the overhead is ~1% of a run, so "full run minus n x forward" is the difference of two
  large, noisy numbers (a few % run-to-run jitter on 2 shared cores) and would be mostly noise, and the forward
  cost of a step depends on how many rows are still active. Why not one cached logits tensor for every
  step: the data-dependent rules would then follow a fake trajectory (confidences that never change as
  cells are filled), so their step counts and per-step work would not be those of a real run.

The forward is timed on the same 256-row prompt batch (median of many calls after warm-up), interleaved with
the sampler timings in every trial, so each trial gives a ratio under the same machine conditions; the
report gives the median over trials and the min-max spread. The network is the trained checkpoint
`checkpoints/sudoku_mdm.pt` if present (else the training run's /tmp/cpuruns/sudoku_mdm/model.pt), else a
randomly initialised CPU-default model: the forward time does not depend on the weights, but the steps the
data-dependent rules take do, so the output names which network produced the logits.
A torch.profiler pass per configuration attributes the overhead to operators (profiler-inflated: relative
sizes only).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import mdmkit.conf  # noqa: E402
from mdmkit.checkpoint import TrainedModel  # noqa: E402
from mdmkit.config import build  # noqa: E402
from mdmkit.evaluation.results import machine  # noqa: E402
from mdmkit.samplers import (  # noqa: E402
    DreamStepsSampler,
    EBSampler,
    FactorSampler,
    ForwardCounter,
    MaskedSampler,
    RevealAllSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.tasks.sudoku import SudokuTask, serialize  # noqa: E402
from mdmkit.tasks.sudoku_generator import generate_puzzles  # noqa: E402

GOAL = 0.03  # overhead per step / one forward at batch 256
CHECKPOINTS = (Path("checkpoints/sudoku_mdm.pt"), Path("/tmp/cpuruns/sudoku_mdm/model.pt"))
ORDERINGS = ("confidence", "entropy", "margin", "random")
SCHEDULE_STEPS = 16  # steps for the step and Dream schedules (the steps.yaml preset; ~3 cells per step here)

RULES: dict[str, Callable[[str], MaskedSampler]] = {
    "top-k k=1": lambda o: TopKSampler(k=1, ordering=o),
    "top-k k=4": lambda o: TopKSampler(k=4, ordering=o),
    f"steps s={SCHEDULE_STEPS}": lambda o: StepsSampler(steps=SCHEDULE_STEPS, ordering=o),
    f"dream s={SCHEDULE_STEPS}": lambda o: DreamStepsSampler(steps=SCHEDULE_STEPS, ordering=o),
    "EB γ=0.1": lambda o: EBSampler(gamma=0.1, ordering=o),
    "threshold τ=0.9": lambda o: ThresholdSampler(tau=0.9, ordering=o),
    "factor f=1.0": lambda o: FactorSampler(factor=1.0, ordering=o),
    "reveal-all": lambda o: RevealAllSampler(ordering=o),
}


class Recorder:
    """Runs the real network and keeps every logits tensor it returns (and the time each call took)."""

    def __init__(self, network: torch.nn.Module) -> None:
        self.network = network
        self.logits: list[torch.Tensor] = []
        self.seconds: list[float] = []

    def __call__(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = self.network(tokens, **kwargs)
        self.seconds.append(time.perf_counter() - start)
        self.logits.append(out)
        return out


class Replay:
    """Stands in for the network: call i returns the logits recorded at call i (no computation)."""

    def __init__(self, logits: list[torch.Tensor]) -> None:
        self.logits = logits
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = self.logits[self.calls]
        if out.shape[0] != tokens.shape[0]:
            raise RuntimeError(f"replay diverged at call {self.calls}: {tokens.shape[0]} rows, recorded {out.shape[0]}")
        self.calls += 1
        return out


@dataclass
class Case:
    rule: str
    ordering: str
    sampler: MaskedSampler
    logits: list[torch.Tensor] = field(default_factory=list)
    tokens: torch.Tensor | None = None
    steps: int = 0
    rows_per_step: float = 0.0
    forward_seconds_recorded: float = 0.0
    overhead: list[float] = field(default_factory=list)  # per trial: seconds per step
    ratio: list[float] = field(default_factory=list)  # per trial: overhead per step / forward at full batch
    profile: list[dict[str, Any]] = field(default_factory=list)
    profile_wall_ms: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.rule} / {self.ordering}"


def load_network(explicit: Path | None, task: SudokuTask) -> tuple[torch.nn.Module, str]:
    for path in (explicit,) if explicit is not None else CHECKPOINTS:
        if path.is_file():
            return TrainedModel(path).network(task), f"trained checkpoint {path}"
        if explicit is not None:
            raise SystemExit(f"--checkpoint {path} does not exist")
    spec = build(OmegaConf.load(Path(mdmkit.conf.__file__).parent / "model" / "cpu.yaml"), "model",
                 vocab_size=task.vocab_size, max_len=task.seq_len)
    torch.manual_seed(0)
    return spec.build().eval(), "random init (no trained checkpoint found), CPU-default shape"


def prompts(batch: int, masked: int, seed: int, mask_id: int) -> torch.Tensor:
    """`batch` real Sudoku puzzles (unique solutions) with `masked` blank cells each, blanks = mask_id."""
    puzzles, solutions = generate_puzzles(batch, 81 - masked, seed)
    tokens = torch.from_numpy(serialize(solutions))
    blanks = torch.from_numpy(serialize(puzzles)) == -1  # blank cells serialise to digit 0 - 1
    return tokens.masked_fill(blanks, mask_id)


def time_forward(network: torch.nn.Module, x: torch.Tensor, reps: int) -> float:
    """Median seconds of one forward of `network` on `x` over `reps` calls (no_grad, as in the sampler)."""
    times = []
    with torch.no_grad():
        for _ in range(reps):
            start = time.perf_counter()
            network(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def replay_once(case: Case, x: torch.Tensor, mask_id: int, seed: int) -> tuple[float, torch.Tensor]:
    stub = Replay(case.logits)
    counter = ForwardCounter(stub, x.shape[0])
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    out = case.sampler.sample(counter, x, mask_id, generator)
    elapsed = time.perf_counter() - start
    if stub.calls != len(case.logits):
        raise RuntimeError(f"{case.label}: replay made {stub.calls} calls, recorded {len(case.logits)}")
    return elapsed, out.tokens


def record(case: Case, network: torch.nn.Module, x: torch.Tensor, mask_id: int, seed: int) -> None:
    recorder = Recorder(network)
    counter = ForwardCounter(recorder, x.shape[0])
    out = case.sampler.sample(counter, x, mask_id, torch.Generator().manual_seed(seed))
    case.logits, case.tokens = recorder.logits, out.tokens
    case.steps = len(recorder.logits)
    case.rows_per_step = sum(t.shape[0] for t in recorder.logits) / case.steps
    case.forward_seconds_recorded = sum(recorder.seconds)


def profile_case(case: Case, x: torch.Tensor, mask_id: int, seed: int, top: int = 8) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        replay_once(case, x, mask_id, seed)
        case.profile_wall_ms = (time.perf_counter() - start) * 1e3
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    case.profile = [
        {"op": e.key, "calls_per_step": e.count / case.steps, "self_ms_per_step": e.self_cpu_time_total / 1e3 / case.steps}
        for e in events[:top]
    ]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=None, help="trials (default 9; --quick: 2)")
    parser.add_argument("--forward-reps", type=int, default=None, help="forwards timed per trial (default 15; --quick: 3)")
    parser.add_argument("--sampler-reps", type=int, default=3, help="replayed runs per configuration per trial (median)")
    parser.add_argument("--masked", type=int, default=45, help="blank cells per puzzle")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: checkpoints/sudoku_mdm.pt, else random init")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 trials, confidence and entropy only")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-operator profile")
    parser.add_argument("--note", default="", help="a line added to the markdown (e.g. conditions of the run)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 9)
    forward_reps = args.forward_reps or (3 if args.quick else 15)
    orderings = ORDERINGS[:2] if args.quick else ORDERINGS
    command = "python " + " ".join([sys.argv[0], *sys.argv[1:]])

    torch.set_num_threads(args.threads)
    task = SudokuTask()
    network, source = load_network(args.checkpoint, task)
    n_params = sum(p.numel() for p in network.parameters())
    x = prompts(args.batch_size, args.masked, args.seed, task.mask_id)
    print(f"network: {source} ({n_params:,} parameters); batch {tuple(x.shape)}, {args.masked} masked per row; "
          f"{torch.get_num_threads()} threads", flush=True)

    for _ in range(5):  # warm-up
        time_forward(network, x, 1)
    cases = [Case(rule, ordering, make(ordering)) for rule, make in RULES.items() for ordering in orderings]
    for case in cases:  # record real trajectories, then check the replay reproduces them
        record(case, network, x, task.mask_id, args.seed)
        _, tokens = replay_once(case, x, task.mask_id, args.seed)
        if not torch.equal(tokens, case.tokens):
            raise RuntimeError(f"{case.label}: replayed run differs from the recorded one")
        solved = task.score(case.tokens, x.masked_fill(x == task.mask_id, 0), x == task.mask_id).float().mean()
        print(f"  recorded {case.label:30s} {case.steps:3d} steps, {case.rows_per_step:6.1f} rows/step, "
              f"solved {solved:.3f}", flush=True)
        case.solved = float(solved)  # type: ignore[attr-defined]

    forward: list[float] = []
    order = random.Random(args.seed)
    for trial in range(repeats):
        gc.collect()
        gc.disable()
        try:
            fwd_before = time_forward(network, x, forward_reps)
            shuffled = cases[:]
            order.shuffle(shuffled)
            for case in shuffled:
                seconds = statistics.median(replay_once(case, x, task.mask_id, args.seed)[0] for _ in range(args.sampler_reps))
                case.overhead.append(seconds / case.steps)
            fwd_after = time_forward(network, x, forward_reps)
        finally:
            gc.enable()
        fwd = statistics.median([fwd_before, fwd_after])
        forward.append(fwd)
        for case in cases:
            case.ratio.append(case.overhead[-1] / fwd)
        worst = max(cases, key=lambda c: c.ratio[-1])
        print(f"trial {trial + 1}/{repeats}: forward {fwd * 1e3:.2f} ms (before {fwd_before * 1e3:.2f}, after "
              f"{fwd_after * 1e3:.2f}); worst {worst.label} {worst.overhead[-1] * 1e3:.3f} ms = {worst.ratio[-1]:.2%}",
              flush=True)

    if not args.no_profile:
        for case in cases:
            profile_case(case, x, task.mask_id, args.seed)

    write_outputs(args, cases, forward, source, n_params, command)


def write_outputs(args: argparse.Namespace, cases: list[Case], forward: list[float], source: str, n_params: int,
                  command: str) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    fwd = summary(forward)
    record = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": command,
        "machine": machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "goal_fraction_of_forward": GOAL,
        "network": source,
        "parameters": n_params,
        "batch_size": args.batch_size,
        "masked_per_row": args.masked,
        "seq_len": 89,
        "dtype": "float32",
        "method": "record-and-replay stub: real trajectories recorded once, sampler timed with the network "
                  "replaced by a lookup of the recorded logits (see the script docstring)",
        "trials": len(forward),
        "forward_ms": {k: v * 1e3 for k, v in fwd.items()} | {"per_trial": [f * 1e3 for f in forward]},
        "note": args.note,
        "results": [
            {
                "rule": c.rule,
                "ordering": c.ordering,
                "sampler": {"class": type(c.sampler).__name__,
                            **{k: v for k, v in vars(c.sampler).items() if not k.startswith("_")}},
                "steps": c.steps,
                "mean_rows_per_step": c.rows_per_step,
                "solved_fraction": c.solved,  # type: ignore[attr-defined]
                "overhead_ms_per_step": {k: v * 1e3 for k, v in summary(c.overhead).items()}
                | {"per_trial": [v * 1e3 for v in c.overhead]},
                "fraction_of_forward": summary(c.ratio) | {"per_trial": c.ratio},
                "meets_goal": statistics.median(c.ratio) <= GOAL,
                "overhead_share_of_recorded_run": (statistics.median(c.overhead) * c.steps)
                / (statistics.median(c.overhead) * c.steps + c.forward_seconds_recorded),
                "profile_top_ops": c.profile,
                "profile_wall_ms_per_step": c.profile_wall_ms / c.steps if c.profile else None,
            }
            for c in cases
        ],
    }
    (out / "sampler_overhead.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    plot(cases, fwd["median"], out / "sampler_overhead.png", source)
    (out / "sampler_overhead.md").write_text(markdown(record))
    print(f"wrote {out / 'sampler_overhead.json'}, .png, .md")


def plot(cases: list[Case], forward_s: float, path: Path, source: str) -> None:
    labels = [c.label for c in cases][::-1]
    medians = [100 * statistics.median(c.ratio) for c in cases][::-1]
    low = [m - 100 * min(c.ratio) for m, c in zip(medians, cases[::-1])]
    high = [100 * max(c.ratio) - m for m, c in zip(medians, cases[::-1])]
    colors = ["tab:blue" if m <= 100 * GOAL else "tab:red" for m in medians]
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(cases) + 1.6))
    ax.barh(labels, medians, xerr=[low, high], color=colors, ecolor="0.3", capsize=2)
    ax.axvline(100 * GOAL, color="tab:red", linestyle="--", label=f"goal {GOAL:.0%}")
    ax.set_xlabel(f"sampler overhead per step, % of one forward ({forward_s * 1e3:.1f} ms, batch 256)")
    ax.set_title(f"Sampler overhead excluding the network\n{source.split(' (')[0]}; bars: median, whiskers: "
                 "min-max over trials", fontsize=9)
    ax.legend(loc="lower right")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(record: dict[str, Any]) -> str:
    fwd = record["forward_ms"]
    lines = [
        "# Sampler overhead per step (excluding the network)",
        "",
        f"One step of `MaskedSampler.sample` without the network forward, as a share of one forward of the "
        f"CPU-default Sudoku model ({record['parameters']:,} parameters, batch {record['batch_size']}, length 89, "
        f"{record['masked_per_row']} masked cells per puzzle, float32, {record['threads']} torch threads). "
        f"Goal: <= {record['goal_fraction_of_forward']:.0%}.",
        "",
        f"- Network: {record['network']}.",
        f"- One forward at batch {record['batch_size']}: **{fwd['median']:.2f} ms** (median over {record['trials']} "
        f"trials of the per-trial median; range {fwd['min']:.2f}-{fwd['max']:.2f} ms).",
        f"- Machine: {record['machine']}; torch {record['torch']}; {record['date']}.",
        f"- Reproduce: `{record['command']}`",
        "- Method: each configuration's real trajectory (temperature 0) is recorded once; the timed runs replay "
        "the recorded logits through a stub network, so the time is pure sampler (and `ForwardCounter`) work, "
        "divided by the number of steps. Forward and sampler are timed interleaved in every trial; the table "
        "gives median [min-max] over trials. Data: `sampler_overhead.json`, chart: `sampler_overhead.png`.",
    ]
    if record["note"]:
        lines.append(f"- Note: {record['note']}")
    lines += [
        "",
        "| rule | ordering | steps | overhead / step (ms) | % of one forward | goal met |",
        "|---|---|---:|---:|---:|:---:|",
    ]
    for r in record["results"]:
        ms, frac = r["overhead_ms_per_step"], r["fraction_of_forward"]
        lines.append(
            f"| {r['rule']} | {r['ordering']} | {r['steps']} | {ms['median']:.3f} [{ms['min']:.3f}-{ms['max']:.3f}] "
            f"| {100 * frac['median']:.2f} [{100 * frac['min']:.2f}-{100 * frac['max']:.2f}] "
            f"| {'yes' if r['meets_goal'] else '**no**'} |"
        )
    lines += ["", "## Interpretation", "", "INTERPRETATION", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

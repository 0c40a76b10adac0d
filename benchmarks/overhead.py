"""Sampler overhead per step, excluding the network forward: record real trajectories, time their replay.

Why record and replay rather than "full run minus n x forward": the overhead is ~1% of a run, so that would
be the difference of two large, noisy numbers (a few % run-to-run jitter on 2 shared cores), and the forward
cost of a step depends on how many rows are still active. Why not one cached logits tensor for every step:
the data-dependent rules (EB, threshold, factor) would then follow a fake trajectory (confidences that never
change as cells fill), so their step counts and per-step work would not be those of a real run.

So each configuration runs once with the real network behind a `Recorder` (temperature 0 and a seeded
generator make the loop deterministic: the exact trajectory an evaluation takes, rows leaving as they
finish); the timed runs then pass a `Replay` that returns the recorded logits of call i at call i, inside the
usual `ForwardCounter`, and are checked to reproduce the recorded tokens. Their wall time is pure sampler work
(plus the counter's bookkeeping, which every evaluation pays too). Forward and sampler are timed interleaved
in every trial, so each trial gives a ratio under the same machine conditions.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mdmkit.core.config import build, option
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.models.denoiser import capabilities_of
from mdmkit.samplers import (
    CreditSampler,
    DreamStepsSampler,
    DUSSampler,
    EBSampler,
    FactorSampler,
    ForwardCounter,
    KlassSampler,
    MaskedSampler,
    ProphetSampler,
    RevealAllSampler,
    Sampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
    WinoSampler,
)
from mdmkit.samplers.rules.slowfast import SlowFastSampler
from mdmkit.tasks.sudoku import SudokuTask, serialize
from mdmkit.tasks.sudoku_generator import generate_puzzles

GOAL = 0.03  # overhead per step / one forward of the CPU-default Sudoku model at batch 256
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
# Rules with loops or per-step state of their own, each timed at the one ordering it defines.
OWN_RULES: dict[str, tuple[str, Callable[[], Sampler]]] = {
    "WINO": ("confidence", lambda: WinoSampler()),
    "DUS base=2": ("schedule", lambda: DUSSampler()),
    "SlowFast": ("confidence", lambda: SlowFastSampler()),
    "KLASS": ("confidence", lambda: KlassSampler()),
    "Credit": ("confidence", lambda: CreditSampler()),
    "Prophet (Top-1 base)": ("confidence", lambda: ProphetSampler(base=TopKSampler(k=1))),
}


class Recorder:
    """Runs the real network and keeps every logits tensor it returns."""

    def __init__(self, network: torch.nn.Module) -> None:
        self.network = network
        self.capabilities = capabilities_of(network)  # what samplers with needs of their own (WINO) check
        self.logits: list[torch.Tensor] = []

    def __call__(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = self.network(tokens, **kwargs)
        self.logits.append(out)
        return out


class Replay:
    """Stands in for the network: call i returns the logits recorded at call i (no computation)."""

    def __init__(self, logits: list[torch.Tensor], capabilities: frozenset[str] = frozenset()) -> None:
        self.logits = logits
        self.capabilities = capabilities
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = self.logits[self.calls]
        if out.shape[0] != tokens.shape[0]:
            raise RuntimeError(
                f"replay diverged at call {self.calls}: {tokens.shape[0]} rows, recorded {out.shape[0]}"
            )
        self.calls += 1
        return out


@dataclass
class Case:
    """One sampler configuration: its recorded trajectory and, per trial, what its replay cost."""

    rule: str
    ordering: str
    sampler: Sampler
    logits: list[torch.Tensor] = field(default_factory=list)
    tokens: torch.Tensor | None = None
    capabilities: frozenset[str] = frozenset()  # the recorded network's, declared by its replay
    steps: int = 0
    rows_per_step: float = 0.0
    overhead: list[float] = field(default_factory=list)  # per trial: seconds per step
    ratio: list[float] = field(default_factory=list)  # per trial: overhead per step / forward at full batch
    rows: list[int] = field(default_factory=list)  # active rows at each step
    # per trial: overhead of the whole run / forward time of the same steps at their row counts
    run_ratio: list[float] = field(default_factory=list)
    profile: list[dict[str, Any]] = field(default_factory=list)
    profile_wall_ms: float = 0.0
    profile_categories: dict[str, float] = field(default_factory=dict)
    profile_ops_per_step: float = 0.0
    solved: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.rule} / {self.ordering}"


def load_network(checkpoint: Path | None, task: SudokuTask) -> tuple[torch.nn.Module, str]:
    """The trained `checkpoint`, or without one a randomly initialised CPU-default model, and which it is.

    The forward time does not depend on the weights, but the steps the data-dependent rules take do.
    """
    if checkpoint is not None:
        return TrainedModel(checkpoint).network(task), f"trained checkpoint {checkpoint}"
    spec = build(option("model", "cpu"), "model", vocab_size=task.vocab_size, max_len=task.seq_len)
    torch.manual_seed(0)
    return spec.build().eval(), "random init (no trained checkpoint found), CPU-default shape"


def prompts(batch: int, masked: int, seed: int, mask_id: int) -> torch.Tensor:
    """`batch` real Sudoku puzzles (unique solutions) with `masked` blank cells each, blanks = mask_id."""
    puzzles, solutions = generate_puzzles(batch, 81 - masked, seed)
    tokens = torch.from_numpy(serialize(solutions))
    blanks = torch.from_numpy(serialize(puzzles)) == -1  # blank cells serialise to digit 0 - 1
    return tokens.masked_fill(blanks, mask_id)


def median_seconds(call: Callable[[], Any], reps: int) -> float:
    """Median wall seconds of `reps` calls of `call` (under no_grad, as in the sampler)."""
    times = []
    with torch.no_grad():
        for _ in range(reps):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_forward(network: torch.nn.Module, x: torch.Tensor, reps: int) -> float:
    """Median seconds of one forward of `network` on `x` over `reps` calls."""
    return median_seconds(lambda: network(x), reps)


def replay_once(case: Case, x: torch.Tensor, mask_id: int, seed: int) -> tuple[float, torch.Tensor]:
    """Seconds of one run of the case's sampler on its recorded logits, and the tokens it produced."""
    stub = Replay(case.logits, case.capabilities)
    counter = ForwardCounter(stub, x.shape[0])
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    out = case.sampler.sample(counter, x, mask_id, generator)
    elapsed = time.perf_counter() - start
    if stub.calls != len(case.logits):
        raise RuntimeError(f"{case.label}: replay made {stub.calls} calls, recorded {len(case.logits)}")
    return elapsed, out.tokens


def record(case: Case, network: torch.nn.Module, x: torch.Tensor, mask_id: int, seed: int) -> None:
    """Run the case once on the real network and keep its logits, tokens and active rows per step."""
    recorder = Recorder(network)
    counter = ForwardCounter(recorder, x.shape[0])
    out = case.sampler.sample(counter, x, mask_id, torch.Generator().manual_seed(seed))
    case.logits, case.tokens, case.capabilities = recorder.logits, out.tokens, recorder.capabilities
    case.steps = len(recorder.logits)
    case.rows = [t.shape[0] for t in recorder.logits]
    case.rows_per_step = sum(case.rows) / case.steps


def forward_curve(network: torch.nn.Module, x: torch.Tensor, reps: int) -> dict[int, float]:
    """Median forward seconds at a grid of row counts up to the batch (a step's cost depends on its rows)."""
    grid = sorted({rows for rows in (1, 8, 32, 64, 128, 192) if rows < x.shape[0]} | {x.shape[0]})
    return {rows: time_forward(network, x[:rows], reps) for rows in grid}


def run_forward_seconds(curve: dict[int, float], rows: list[int]) -> float:
    """Forward time of a trajectory: each step's row count, linearly interpolated on the measured curve."""
    return float(np.interp(rows, list(curve), list(curve.values())).sum())


def summary(values: list[float]) -> dict[str, float]:
    """Median, min and max: what the page reports of every per-trial measurement."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def record_cases(cases: list[Case], network: torch.nn.Module, x: torch.Tensor, task: SudokuTask,
                 seed: int) -> None:
    """Record every case's real trajectory and check that its replay reproduces it token for token."""
    for case in cases:
        record(case, network, x, task.mask_id, seed)
        _, tokens = replay_once(case, x, task.mask_id, seed)
        if not torch.equal(tokens, case.tokens):
            raise RuntimeError(f"{case.label}: replayed run differs from the recorded one")
        masked = x == task.mask_id
        case.solved = float(task.score(case.tokens, x.masked_fill(masked, 0), masked).float().mean())
        print(f"  recorded {case.label:30s} {case.steps:3d} steps, {case.rows_per_step:6.1f} rows/step, "
              f"solved {case.solved:.3f}", flush=True)


@dataclass
class ForwardTimes:
    """Per trial: seconds of one forward at the full batch, and by active rows (to cost a shrinking run)."""

    full_batch: list[float] = field(default_factory=list)
    by_rows: list[dict[int, float]] = field(default_factory=list)


def time_trials(cases: list[Case], network: torch.nn.Module, x: torch.Tensor, mask_id: int, trials: int,
                forward_reps: int, sampler_reps: int, seed: int) -> ForwardTimes:
    """`trials` rounds of: forward, every case's replay (`sampler_reps` runs, median; cases in a fresh random
    order), forward again. Fills each case's per-trial overhead and ratios; the garbage collector is off while
    timing so that a collection cannot land inside one measurement."""
    forward = ForwardTimes()
    order = random.Random(seed)
    for trial in range(trials):
        gc.collect()
        gc.disable()
        try:
            before = time_forward(network, x, forward_reps)
            forward.by_rows.append(forward_curve(network, x, max(3, forward_reps // 5)))
            shuffled = cases[:]
            order.shuffle(shuffled)
            for case in shuffled:
                runs = [replay_once(case, x, mask_id, seed)[0] for _ in range(sampler_reps)]
                seconds = statistics.median(runs)
                case.overhead.append(seconds / case.steps)
            after = time_forward(network, x, forward_reps)
        finally:
            gc.enable()
        full_batch = statistics.median([before, after])
        forward.full_batch.append(full_batch)
        for case in cases:
            case.ratio.append(case.overhead[-1] / full_batch)
            run_forwards = run_forward_seconds(forward.by_rows[-1], case.rows)
            case.run_ratio.append(case.overhead[-1] * case.steps / run_forwards)
        worst = max(cases, key=lambda c: c.ratio[-1])
        print(f"trial {trial + 1}/{trials}: forward {full_batch * 1e3:.2f} ms (before {before * 1e3:.2f}, "
              f"after {after * 1e3:.2f}); worst {worst.label} {worst.overhead[-1] * 1e3:.3f} ms = "
              f"{worst.ratio[-1]:.2%}", flush=True)
    return forward

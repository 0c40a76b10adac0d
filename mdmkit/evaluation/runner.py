"""Sample a split with a sampler and score it, counting every forward pass per sample."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mdmkit.analysis.stats import wilson_interval
from mdmkit.core.progress import ForwardTicks, progress_bar
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.evaluation.distributed import SINGLE_PROCESS, Ranks
from mdmkit.models.denoiser import require_capabilities
from mdmkit.samplers import ForwardCounter, Sampler
from mdmkit.samplers.rules.oracle import oracle_floor
from mdmkit.tasks.base import PuzzleTask, Split


@dataclass
class EvalResult:
    correct: np.ndarray  # bool [N]
    nfe: np.ndarray  # int [N], forward passes each sample took part in
    wall_time_s: float
    predictions: torch.Tensor | list[str] = field(repr=False)  # token rows (puzzles) or decoded texts
    extra_cost: dict[str, np.ndarray] = field(default_factory=dict)  # fractional passes per kind, per sample
    oracle_nfe: np.ndarray | None = None  # the oracle floor of this sampler's trajectories (if asked for)
    nfe_to_stop: np.ndarray | None = None  # NFE when the stop condition was met (= nfe without one)
    answer_tokens: np.ndarray | None = None  # tokens each sample had to generate
    metrics: dict[str, Any] = field(default_factory=dict)  # the task's split-level measures (PuzzleTask.sample_metrics)
    computed_tokens: np.ndarray | None = None  # tokens the network ran per sample, over all its forwards

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    def summary(self) -> dict[str, Any]:
        to_stop = self.nfe if self.nfe_to_stop is None else self.nfe_to_stop
        tokens = int(self.answer_tokens.sum()) if self.answer_tokens is not None else None
        summary = {
            "n": len(self.correct),
            "accuracy": self.accuracy,
            "accuracy_ci95": list(wilson_interval(int(self.correct.sum()), len(self.correct))),
            "nfe_mean": float(self.nfe.mean()),
            "nfe_median": float(np.median(self.nfe)),
            "nfe": describe(self.nfe),
            "nfe_to_stop_mean": float(to_stop.mean()),
            "nfe_to_stop_median": float(np.median(to_stop)),
            "tokens_per_step": tokens / max(1, int(self.nfe.sum())) if tokens is not None else None,
            "tokens_per_s": tokens / self.wall_time_s if tokens is not None and self.wall_time_s > 0 else None,
            "wall_time_s": self.wall_time_s,
            # full-forward units: NFE plus the fractional passes (planner, indicator, ...), also given per kind
            "cost_mean": float(self.nfe.mean() + sum(c.mean() for c in self.extra_cost.values())),
            "extra_cost_mean": {kind: float(c.mean()) for kind, c in self.extra_cost.items()},
            # the other cost axis: tokens run per sample, and per forward (a full forward runs the whole canvas,
            # a KV-cached one only its queries)
            "computed_tokens_mean": None if self.computed_tokens is None else float(self.computed_tokens.mean()),
            "tokens_per_forward_mean": (None if self.computed_tokens is None
                                        else float(self.computed_tokens.sum()) / max(1, int(self.nfe.sum()))),
        }
        summary.update(self.metrics)
        if self.oracle_nfe is not None:
            summary.update(oracle_nfe_mean=float(self.oracle_nfe.mean()), oracle_nfe=describe(self.oracle_nfe))
        return summary


def describe(counts: np.ndarray) -> dict[str, Any]:
    """Spread of per-sample forward counts: moments, percentiles and the full histogram."""
    values = counts.astype(float)
    return {
        "std": float(values.std()),
        "min": int(counts.min()),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "max": int(counts.max()),
        "histogram": {int(v): int(c) for v, c in enumerate(np.bincount(counts)) if c},
    }


@dataclass
class _BatchResult:
    """What one batch produced, tagged with its position in the single-process order."""

    index: int
    correct: torch.Tensor
    nfe: torch.Tensor
    to_stop: torch.Tensor
    answer_tokens: torch.Tensor
    computed: torch.Tensor
    extra: dict[str, torch.Tensor]
    predicted: torch.Tensor
    floor: torch.Tensor | None


@torch.no_grad()
def sample_split(
    network: nn.Module,
    task: PuzzleTask,
    split: Split,
    sampler: Sampler,
    batch_size: int = 256,
    seed: int = 0,
    progress: bool = False,
    oracle: bool = False,
    ranks: Ranks = SINGLE_PROCESS,
) -> EvalResult | None:
    """Mask every answer position, let `sampler` fill them, and score the completions.

    Batch `i` draws from random stream `i` of `seed`, so under data parallelism (`ranks`: this process's share of
    the batches) rank 0 returns the single-process result and the other ranks None. With `oracle`, also compute
    each trajectory's oracle floor (its passes are not part of the timing).
    """
    require_capabilities(sampler, network)
    device = next(network.parameters()).device
    was_training = network.training
    network.eval()
    done: list[_BatchResult] = []
    oracle_time = 0.0
    start = time.perf_counter()
    batches = ranks.batches(len(split), batch_size)
    bar = progress_bar(total=len(batches), desc="sampling", unit="batch", disable=not (progress and ranks.main),
                       leave=False)
    ticks = ForwardTicks(bar)
    for batch in batches:
        target = split.tokens[batch.begin : batch.end].to(device)
        answer_mask = split.answer_mask[batch.begin : batch.end].to(device)
        counter = ForwardCounter(network, target.shape[0], on_forward=ticks)
        prompt = target.masked_fill(answer_mask, task.mask_id)
        generator = seeded_generator(stream_seed(seed, batch.index), device)
        sampled = sampler.sample(counter, prompt, task.mask_id, generator, stop=task.stop_condition())
        floor = None
        if oracle:
            oracle_start = time.perf_counter()
            floor = oracle_floor(network, prompt, sampled, task.mask_id).cpu()
            oracle_time += time.perf_counter() - oracle_start
        done.append(_BatchResult(
            batch.index, task.score(sampled.tokens, target, answer_mask).cpu(), counter.nfe, counter.nfe_to_stop,
            answer_mask.sum(1).cpu(), counter.tokens, counter.extra, sampled.tokens.cpu(), floor))
        bar.update(1)
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start - oracle_time
    network.train(was_training)
    gathered = ranks.gather((done, wall))
    if gathered is None:
        return None
    parts = sorted((part for batch_results, _ in gathered for part in batch_results), key=lambda part: part.index)
    return _merge(parts, max(seconds for _, seconds in gathered), task, oracle)


def _merge(parts: list[_BatchResult], wall: float, task: PuzzleTask, oracle: bool) -> EvalResult:
    """One result from every batch's, in split order (the task's split-level metrics on all predictions)."""
    kinds = sorted({kind for part in parts for kind in part.extra})
    extra_cost = {kind: torch.cat([part.extra.get(kind, torch.zeros(len(part.nfe), dtype=torch.float64))
                                   for part in parts]).numpy() for kind in kinds}
    predicted = torch.cat([part.predicted for part in parts])

    def cat(field: str) -> np.ndarray:
        return torch.cat([getattr(part, field) for part in parts]).numpy()

    return EvalResult(
        cat("correct"), cat("nfe"), wall, predicted, extra_cost, cat("floor") if oracle else None, cat("to_stop"),
        cat("answer_tokens"), task.sample_metrics(predicted), cat("computed"),
    )

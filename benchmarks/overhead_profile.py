"""Where a sampler step's time goes: operators and their categories (torch.profiler), and the step's
vocabulary-wide operations timed alone next to cheaper equivalents.

Why both: the profiler attributes a replayed run to operators but inflates small ones, so its numbers are
read as shares; the single operations, timed without it on one real logits tensor, give absolute costs and
show what a faster loop could use instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks.overhead import Case, median_seconds, replay_once

CATEGORIES = (
    "vocabulary-wide ops on [R, L, V] (mask-token fill, softmax, argmax, entropy, top-2)",
    "row gather/scatter on [B, L] (x[rows], masked[rows], ...[rows] = ..., nonzero)",
    "argsort of the error proxy",
    "other [R, L] ops (eligibility, blocks, budget rule, reveal)",
)
_ROW_OPS = {"aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::nonzero", "aten::copy_"}


def category(op: str, shapes: list[list[int]], vocab: int) -> str:
    """Which of `CATEGORIES` an operator call belongs to, from its name and input shapes."""
    if any(len(shape) == 3 and shape[-1] == vocab for shape in shapes):
        return CATEGORIES[0]
    if op in _ROW_OPS:
        return CATEGORIES[1]
    if op in ("aten::sort", "aten::argsort"):
        return CATEGORIES[2]
    return CATEGORIES[3]


@contextlib.contextmanager
def quiet_native_output() -> Iterator[None]:
    """Silence what C++ writes to fds 1 and 2 (the profiler logs a line at each start and stop)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved, devnull = [os.dup(1), os.dup(2)], os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def profile_case(case: Case, x: torch.Tensor, mask_id: int, vocab: int, seed: int, top: int = 8) -> None:
    """Self CPU time per operator (top `top`) and per category, per step; the rest of the wall time is
    Python, dispatch and profiler overhead. Profiling inflates small ops: read shares, not absolute ms."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_native_output(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        replay_once(case, x, mask_id, seed)
        case.profile_wall_ms = (time.perf_counter() - start) * 1e3
    by_op: dict[str, list[float]] = {}
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.key_averages(group_by_input_shape=True):
        ms = event.self_cpu_time_total / 1e3 / case.steps
        entry = by_op.setdefault(event.key, [0.0, 0.0])
        entry[0] += event.count / case.steps
        entry[1] += ms
        by_category[category(event.key, event.input_shapes or [], vocab)] += ms
    ranked = sorted(by_op.items(), key=lambda item: item[1][1], reverse=True)
    case.profile = [
        {"op": op, "calls_per_step": calls, "self_ms_per_step": ms} for op, (calls, ms) in ranked[:top]
    ]
    case.profile_categories = by_category
    case.profile_ops_per_step = sum(calls for calls, _ in by_op.values())


def components(logits: torch.Tensor, mask_id: int, reps: int) -> dict[str, float]:
    """Median ms of single operations of a step on one real [B, L, V] logits tensor, plus cheaper
    equivalents of the two vocabulary-wide ones that dominate (what a faster loop could use)."""
    masked = logits.index_fill(-1, torch.tensor([mask_id]), float("-inf"))
    probs = masked.softmax(-1)
    error = torch.rand(logits.shape[:2])

    def manual_softmax() -> torch.Tensor:
        exp = (masked - masked.amax(-1, keepdim=True)).exp()
        return exp / exp.sum(-1, keepdim=True)

    def second_max() -> torch.Tensor:
        best, index = probs.max(-1)
        return best - probs.scatter(-1, index[..., None], -1.0).amax(-1)

    ops: dict[str, Callable[[], Any]] = {
        "index_fill of the mask token (copy of [B, L, V])": lambda: logits.index_fill(
            -1, torch.tensor([mask_id]), float("-inf")
        ),
        "softmax over V (aten)": lambda: masked.softmax(-1),
        "softmax over V written out (exp(l - max) / sum)": manual_softmax,
        "max over V (argmax choice)": lambda: probs.max(-1),
        "entropy over V": lambda: -(probs * probs.clamp_min(1e-30).log()).sum(-1),
        "topk(2) over V (margin)": lambda: probs.topk(2, dim=-1),
        "margin via max + masked max": second_max,
        "stable argsort over L": lambda: error.argsort(dim=1, stable=True),
    }
    out = {}
    for name, op in ops.items():
        median_seconds(op, 3)  # warm-up
        out[name] = median_seconds(op, reps) * 1e3
    return out

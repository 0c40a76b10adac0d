"""Items made in chunks, over a process pool where asked, returned in order under one progress bar.

The generators here make item i from (seed, i) alone, so how the items are split over processes changes
nothing but the time.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import operator
from collections.abc import Callable, Iterator
from typing import TypeVar

from mdmkit.core.progress import progress_bar

Chunk = TypeVar("Chunk")


def _call(job: tuple[Callable[[int, int], Chunk], int, int]) -> Chunk:
    make, start, stop = job
    return make(start, stop)


def in_chunks(make: Callable[[int, int], Chunk], count: int, workers: int, max_chunk: int, desc: str, unit: str,
              progress: bool) -> Iterator[tuple[int, int, Chunk]]:
    """`(start, stop, make(start, stop))` for consecutive ranges covering 0..count-1, in order. `make` must
    pickle (a module-level function or a partial of one) when `workers` > 1."""
    if operator.index(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    size = min(max_chunk, max(1, count // (workers * 8)))
    jobs = [(make, start, min(start + size, count)) for start in range(0, count, size)]
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress_bar(total=count, desc=desc, unit=unit, disable=not progress))
        results: Iterator[Chunk]
        if workers > 1 and len(jobs) > 1:
            results = stack.enter_context(mp.get_context().Pool(min(workers, len(jobs)))).imap(_call, jobs)
        else:
            results = map(_call, jobs)
        for (_, start, stop), result in zip(jobs, results):
            yield start, stop, result
            bar.update(stop - start)

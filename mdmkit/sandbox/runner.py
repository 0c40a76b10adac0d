"""Entry points: run one program or many (in parallel threads, one sandbox each); results in input order."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from mdmkit.core.config import require
from mdmkit.core.progress import progress_bar
from mdmkit.sandbox import uids
from mdmkit.sandbox.isolation import Backend, resolve
from mdmkit.sandbox.limits import ExecutionResult, SandboxLimits, check_allowed
from mdmkit.sandbox.verdict import Check, run_check


def _as_check(program: Check | str) -> Check:
    return program if isinstance(program, Check) else Check(solution=program)


def backend_for(limits: SandboxLimits, allow: bool = False) -> Backend:
    """The backend that runs programs under `limits`, or `UnsafeExecutionError` now: without the opt-in,
    without bwrap where it is asked for or needed (a GPU node), or, for root, without the machine's uid counter.
    Callers check it before work they would lose."""
    check_allowed(allow)
    backend = resolve(limits.isolation)
    if os.geteuid() == 0:
        uids.allocate()  # a root caller's sandboxes each draw a uid: a counter that cannot be kept refuses now
    return backend


def run_program(
    program: Check | str, limits: SandboxLimits | None = None, *, allow: bool = False
) -> ExecutionResult:
    """Run one program: a `Check` (verdict from the trusted checks) or a bare script (passes if it loads)."""
    limits = limits if limits is not None else SandboxLimits()
    return run_check(_as_check(program), limits, backend_for(limits, allow))


def run_many(
    programs: Sequence[Check | str],
    limits: SandboxLimits | None = None,
    workers: int = 2,
    progress: bool = True,
    *,
    allow: bool = False,
) -> list[ExecutionResult]:
    """Run every program, `workers` sandboxes at a time; one sandbox failing never loses the others."""
    require(workers >= 1, f"workers={workers} must be >= 1")
    limits = limits if limits is not None else SandboxLimits()
    backend = backend_for(limits, allow)  # refuses (or warns) once, before anything runs
    results: dict[int, ExecutionResult] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_check, _as_check(p), limits, backend): i for i, p in enumerate(programs)}
        with progress_bar(total=len(programs), disable=not progress, desc="sandbox", unit="prog") as bar:
            for future in as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as error:  # noqa: BLE001 -- one sandbox failure never loses the others
                    results[i] = ExecutionResult(False, "error", None, "", "", 0.0, False,
                                                 reason=f"sandbox error: {error!r}", isolation=backend.name)
                bar.update(1)
    return [results[i] for i in range(len(programs))]  # every future has completed

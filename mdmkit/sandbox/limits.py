"""Settings and results of the sandbox, and the opt-in gate: what every other sandbox module shares."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from mdmkit.core.config import Validated, require
from mdmkit.core.errors import MdmkitError

ENV_VAR = "MDMKIT_ALLOW_CODE_EXECUTION"
ISOLATION_ENV = "MDMKIT_SANDBOX_ISOLATION"
ISOLATION_MODES = ("auto", "bwrap", "process")


class UnsafeExecutionError(MdmkitError):
    """Executing generated code was not allowed, or not with the isolation asked for."""


@dataclass
class SandboxLimits(Validated):
    """Per-program limits. `memory_mb` and `max_processes` hold for the whole sandbox (all its processes and
    threads) through cgroups where a cgroup v2 hierarchy is writable, else through rlimits per process plus a
    watchdog that sums the sandbox's tasks and memory every 20 ms. `isolation`: auto | bwrap | process
    (default: $MDMKIT_SANDBOX_ISOLATION, else auto); see docs/sandbox.md."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64_000
    max_reply_bytes: int = 1_000_000
    disk_mb: int = 64
    isolation: str = field(default_factory=lambda: os.environ.get(ISOLATION_ENV, "auto"))

    def validate(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files",
                     "max_output_bytes", "max_reply_bytes", "disk_mb"):
            value = getattr(self, name)
            require(value > 0, f"{name}={value} must be > 0")
        require(math.isfinite(self.timeout_s), f"timeout_s={self.timeout_s} must be finite")
        require(self.max_open_files >= 16, f"max_open_files={self.max_open_files} must be >= 16 (Python needs some)")
        require(self.isolation in ISOLATION_MODES,
                f"isolation={self.isolation!r} must be one of {', '.join(ISOLATION_MODES)} (${ISOLATION_ENV})")


@dataclass
class ExecutionResult:
    """Outcome of one program. `status`: passed | failed | error | timeout | killed; `reason` says why.

    `isolation` names the backend that ran it (bwrap | process) and `protections` what held around it, e.g.
    ("bwrap", "cgroup", ..., "read-only-fs", "seccomp", "non-root") or ("rlimits", "watchdog", "netns", ...).
    """

    passed: bool
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool
    reason: str = ""
    isolation: str = ""
    protections: tuple[str, ...] = ()


def check_allowed(allow: bool = False) -> None:
    """Raise `UnsafeExecutionError` unless code execution is opted into."""
    if not allow and os.environ.get(ENV_VAR) != "1":
        raise UnsafeExecutionError(
            f"refusing to execute generated code: it is untrusted; set {ENV_VAR}=1 (or pass allow=True) to opt in "
            "(docs/sandbox.md says what the sandbox contains)"
        )

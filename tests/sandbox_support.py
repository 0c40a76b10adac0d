"""What the sandbox's test modules share: the modes, what the fallback gets on this machine, runs, sleepers.

Their fixtures (`mode`, `marker`, `allow_code_execution`) are in conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mdmkit.sandbox import Check, SandboxLimits, run_program

ROOT = Path(__file__).resolve().parents[1]
ROOT_USER = os.geteuid() == 0


def _kernel_allows_namespaces() -> bool:
    """Whether this user may make network, pid, ipc and mount namespaces here (a user also needs a user
    namespace): asked of the kernel directly, so that the fallback's tests expect what it could get."""
    flags = 0x40000000 | 0x20000000 | 0x08000000 | 0x00020000 | (0x10000000 if os.geteuid() != 0 else 0)
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare({flags}) != 0)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0


FALLBACK_NS = _kernel_allows_namespaces()
SECCOMP = os.uname().machine in ("x86_64", "aarch64")  # the architectures whose filter the sandbox installs


def contained(mode: str) -> bool:
    """bwrap, or the fallback with its namespaces: a private /tmp, /dev/shm and /proc, no network, own pids."""
    return mode == "bwrap" or FALLBACK_NS


def user_wide_nproc(mode: str) -> bool:
    """The fallback run by a non-root user without a user namespace: RLIMIT_NPROC counts all this user's
    processes, so a fork or thread bomb is stopped by fork() failing rather than by the watchdog's kill."""
    return mode == "process" and not ROOT_USER and not FALLBACK_NS


def limits(mode: str, **changes) -> SandboxLimits:
    return SandboxLimits(**{"timeout_s": 3.0, "memory_mb": 256, "max_processes": 32, "max_output_bytes": 10_000,
                            "isolation": mode, **changes})


def run(mode: str, program: Check | str, **changes):
    return run_program(program, limits(mode, **changes))


def leftovers(marker: str) -> list[int]:
    """Processes anywhere on the machine whose command line carries `marker`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


def sleeper(marker: str, seconds: int = 30) -> str:
    return f"os.execv('/bin/sleep', [{marker!r}, '{seconds}'])"


def held_together(body: str, processes: int, marker: str, prelude: str, wait_s: float) -> str:
    """A program of `processes` processes that each run `body` (after `prelude`), print `held` or `refused
    <errno>`, then wait (at most `wait_s`) until all have tried, so that what they hold is held at once. Each
    leaves `/tmp/<marker>-tried-<pid>`: the caller removes them where the sandbox's /tmp is the machine's."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return (
        f"import os, time\n{prelude}marker = {marker!r}\n"
        f"for _ in range({processes - 1}):\n    if os.fork() == 0:\n        break\n"
        f"try:\n{indented}\n    print('held', flush=True)\n"
        "except OSError as e:\n    print('refused', e.errno, flush=True)\n"
        "open(f'/tmp/{marker}-tried-{os.getpid()}', 'w').close()\n"
        f"deadline = time.monotonic() + {wait_s}\n"
        f"while (sum(n.startswith(f'{{marker}}-tried-') for n in os.listdir('/tmp')) < {processes}\n"
        "       and time.monotonic() < deadline):\n"
        "    time.sleep(0.02)\n"
    )

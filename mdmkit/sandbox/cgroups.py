"""cgroup v2 limits for one sandbox: memory and task count for all its processes together, and a clean kill.

rlimits bound each process alone (four processes of 800 MB each pass a 1 GB RLIMIT_AS); a cgroup bounds their
sum, counts threads, and `cgroup.kill` ends everything in it at once. A cgroup needs a writable v2 hierarchy
whose `cgroup.subtree_control` already enables `memory` and `pids` (a delegated cgroup: systemd's
`Delegate=yes`, a container runtime, or one the administrator prepared); name it with $MDMKIT_SANDBOX_CGROUP,
else the caller's own cgroup is tried. Where neither works the sandbox falls back to rlimits and the watchdog.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from pathlib import Path

from mdmkit.sandbox import procs

CGROUP_ENV = "MDMKIT_SANDBOX_CGROUP"
_counter = itertools.count()


def _own_cgroup() -> Path | None:
    """The caller's cgroup in the v2 hierarchy, as a directory, or None if there is no v2 mount."""
    try:
        relative = next(line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                        if line.startswith("0::"))
        mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except (OSError, StopIteration):
        return None
    for fields in mounts:
        if fields[fields.index("-") + 1] == "cgroup2":  # mount root (fields[3]) is where the view starts
            return Path(fields[4]) / os.path.relpath(relative, fields[3])
    return None


@functools.lru_cache(maxsize=1)
def parent() -> tuple[Path | None, str]:
    """(the cgroup to create sandboxes under, or None; why not)."""
    explicit = os.environ.get(CGROUP_ENV)
    base = Path(explicit) if explicit else _own_cgroup()
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError as error:
        return None, f"cannot read {base}/cgroup.subtree_control ({error.strerror})"
    if not {"memory", "pids"} <= set(enabled):
        return None, f"{base} does not delegate the memory and pids controllers to sub-cgroups"
    probe = base / f"mdmkit-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        return None, f"cannot create cgroups under {base} ({error.strerror})"
    return base, ""


class Cgroup:
    """A fresh cgroup under `parent` with the sandbox's memory and task limits."""

    def __init__(self, parent_dir: Path, memory_mb: int, max_tasks: int):
        self.path = parent_dir / f"mdmkit-sandbox-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        try:
            self._write("memory.max", str(memory_mb * 1024 * 1024))
            if (self.path / "memory.swap.max").exists():
                self._write("memory.swap.max", "0")
            self._write("pids.max", str(max_tasks))
        except OSError:
            self.remove()
            raise

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started inside this cgroup (a shell moves itself in, then execs it: no race with forks)."""
        return ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def _events(self, name: str) -> dict[str, int]:
        try:
            lines = (self.path / name).read_text().split("\n")
        except OSError:
            return {}
        return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}

    def breach(self) -> str:
        """Which limit the kernel enforced so far ("" if none)."""
        if self._events("memory.events").get("oom_kill", 0):
            return "memory"
        if self._events("pids.events").get("max", 0):
            return "tasks"
        return ""

    def pids(self) -> list[int]:
        try:
            return [pid for pid in map(int, (self.path / "cgroup.procs").read_text().split()) if pid > 1]
        except OSError:
            return []

    def kill(self) -> None:
        """Everything in the cgroup, at once where the kernel has cgroup.kill (5.14+), else one by one."""
        try:
            self._write("cgroup.kill", "1")
        except OSError:
            pass
        procs.kill_until_gone(self.pids)

    def remove(self) -> None:
        for _ in range(200):  # the kernel empties a killed cgroup within milliseconds
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)

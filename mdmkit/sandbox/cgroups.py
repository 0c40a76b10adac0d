"""cgroup limits for one sandbox: memory and task count for all its processes together, and a clean kill.

rlimits bound each process alone (four processes of 800 MB each pass a 1 GB RLIMIT_AS) and a watchdog only
sees what /proc shows; a cgroup's memory controller charges every page the sandbox holds (anonymous memory,
memfd and shared memory, tmpfs files) to the sandbox, counts threads, and ends everything in it. Both
hierarchies work:
- cgroup v2: a writable directory whose `cgroup.subtree_control` enables `memory` and `pids` (systemd's
  `Delegate=yes`, a container runtime, or one an administrator prepared); name it with $MDMKIT_SANDBOX_CGROUP,
  else the caller's own cgroup is tried.
- cgroup v1: the caller's own cgroups in the `memory` and `pids` hierarchies, where it may create children
  (root, as in most containers and CI).
Where neither works the sandbox falls back to rlimits and the watchdog.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mdmkit.sandbox import procs

CGROUP_ENV = "MDMKIT_SANDBOX_CGROUP"
_counter = itertools.count()


@dataclass(frozen=True)
class Place:
    """Where sandboxes' cgroups are made: a v2 directory (`pids` None), or v1's memory and pids directories."""

    memory: Path
    pids: Path | None = None

    def __str__(self) -> str:
        return str(self.memory) if self.pids is None else f"{self.memory} and {self.pids} (v1)"


def _mounts() -> list[tuple[str, str, str, str]]:
    """(file system type, mount point, root of the mount, super options) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        rest = fields[fields.index("-") + 1:]
        found.append((rest[0], fields[4], fields[3], rest[2] if len(rest) > 2 else ""))
    return found


def _own(controller: str) -> Path | None:
    """This process's cgroup as a directory: v2 for controller "", else the v1 hierarchy with `controller`."""
    try:
        entries = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = _mounts()
    except OSError:
        return None
    for _, controllers, relative in entries:
        if controller not in (controllers.split(",") if controllers else [""]):
            continue
        for fstype, point, root, options in mounts:
            if (fstype == "cgroup2" and not controller) or (
                    fstype == "cgroup" and controller and controller in options.split(",")):
                return Path(point) / os.path.relpath(relative, root)
    return None


def _creatable(base: Path) -> str:
    # One name per thread: run_many's first sandboxes probe at once, and a clash read as "no cgroup here".
    probe = base / f"mdmkit-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        return f"cannot create cgroups under {base} ({error.strerror})"
    return ""


def _v2(base: Path | None) -> tuple[Place | None, str]:
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError as error:
        return None, f"cannot read {base}/cgroup.subtree_control ({error.strerror})"
    if not {"memory", "pids"} <= set(enabled):
        return None, f"{base} does not delegate the memory and pids controllers to sub-cgroups"
    why = _creatable(base)
    return (None, why) if why else (Place(base), "")


def _v1() -> tuple[Place | None, str]:
    memory, pids = _own("memory"), _own("pids")
    if memory is None or pids is None:
        return None, "no cgroup v1 memory and pids hierarchies"
    why = _creatable(memory) or _creatable(pids)
    return (None, why) if why else (Place(memory, pids), "")


@functools.lru_cache(maxsize=1)
def parent() -> tuple[Place | None, str]:
    """(where to create sandboxes' cgroups, or None; why not)."""
    explicit = os.environ.get(CGROUP_ENV)
    if explicit:
        return _v2(Path(explicit))
    place, why_not_v2 = _v2(_own(""))
    if place is not None:
        return place, ""
    place, why_not_v1 = _v1()
    return (place, "") if place is not None else (None, f"{why_not_v2}; {why_not_v1}")


class Cgroup:
    """A fresh cgroup (v2) or pair of cgroups (v1) with the sandbox's memory and task limits."""

    def __init__(self, place: Place, memory_mb: int, max_tasks: int):
        name = f"mdmkit-sandbox-{os.getpid()}-{next(_counter)}"
        self.v1 = place.pids is not None
        self.dirs = [place.memory / name] + ([place.pids / name] if place.pids is not None else [])
        self.path = self.dirs[0]
        limit = str(memory_mb * 1024 * 1024)
        # v1 bounds memory and swap together, v2 each alone: either way no swap beyond the limit
        memory, swap, no_swap = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", limit) if self.v1 else \
            ("memory.max", "memory.swap.max", "0")
        try:
            for directory in self.dirs:
                directory.mkdir()
            (self.path / memory).write_text(limit)
            if (self.path / swap).exists():
                (self.path / swap).write_text(no_swap)
            (self.dirs[-1] / "pids.max").write_text(str(max_tasks))
        except OSError:
            self.remove()
            raise

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started inside this cgroup (a shell moves itself in, then execs it: no race with forks)."""
        files = [str(directory / "cgroup.procs") for directory in self.dirs]
        script = 'echo 0 > "$0" && exec "$@"' if len(files) == 1 else \
            'echo 0 > "$0" && echo 0 > "$1" && shift && exec "$@"'
        return ["/bin/sh", "-c", script, *files, *argv]

    @staticmethod
    def _events(path: Path) -> dict[str, int]:
        try:
            lines = path.read_text().split("\n")
        except OSError:
            return {}
        pairs = (line.split() for line in lines if line.strip())
        return {fields[0]: int(fields[1]) for fields in pairs if len(fields) == 2 and fields[1].isdigit()}

    def breach(self) -> str:
        """Which limit the kernel enforced so far ("" if none)."""
        memory = self.dirs[0] / ("memory.oom_control" if self.v1 else "memory.events")
        if self._events(memory).get("oom_kill", 0):
            return "memory"
        if self._events(self.dirs[-1] / "pids.events").get("max", 0):
            return "tasks"
        return ""

    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.dirs:
            try:
                found.update(pid for pid in map(int, (directory / "cgroup.procs").read_text().split()) if pid > 1)
            except OSError:
                pass
        return sorted(found)

    def kill(self) -> list[int]:
        """Everything in the cgroup, at once where the kernel has cgroup.kill (v2, 5.14+), else one by one;
        the survivors, if any."""
        if not self.v1:
            try:
                (self.path / "cgroup.kill").write_text("1")
            except OSError:
                pass
        return procs.kill_until_gone(self.pids)

    def remove(self) -> None:
        for directory in self.dirs:
            for _ in range(200):  # the kernel empties a killed cgroup within milliseconds
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)

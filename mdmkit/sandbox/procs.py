"""The sandbox's processes as /proc shows them: who they are, what they use, and killing them all.

Used by the watchdog where no cgroup bounds the sandbox, and to make sure nothing outlives a run. A pid
namespace (bwrap; the process fallback as root) keeps every process of the sandbox a descendant of its first
process, since orphans are re-parented to the namespace's init; without one, a process that double-forks and
calls setsid() escapes both the tree and the session, which docs/sandbox.md states.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from mdmkit.sandbox import mounts

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after "pid (comm)", or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return None if not fields or fields[0] in (b"Z", b"X") else fields


def _children(pid: int) -> list[int] | None:
    """Children of every thread of `pid`; None if the kernel has no /proc/*/task/*/children."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return found


def _every_process() -> dict[int, list[bytes]]:
    """`_stat_fields` of every live process, by pid: one scan of /proc."""
    return {int(e): fields for e in os.listdir("/proc") if e.isdigit() and (fields := _stat_fields(int(e))) is not None}


def tree(root: int) -> list[int]:
    """`root` and its live descendants (root first)."""
    if _stat_fields(root) is None:
        return []
    found, queue, parents = [root], [root], None
    while queue:
        pid = queue.pop()
        kids = _children(pid)
        if kids is None:  # no children files: one scan of /proc gives every parent
            parents = parents if parents is not None else {p: int(f[1]) for p, f in _every_process().items()}
            kids = [child for child, parent in parents.items() if parent == pid]
        for child in kids:
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def session(sid: int) -> list[int]:
    """Live processes whose session id is `sid`."""
    return [pid for pid, fields in _every_process().items() if int(fields[3]) == sid]


def usage(pids: list[int]) -> tuple[int, int]:
    """(tasks: processes and their threads, resident memory in bytes) of `pids`."""
    tasks = rss = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and len(fields) > 21:
            tasks += int(fields[17])
            rss += int(fields[21]) * _PAGE
    return tasks, rss


def private_tmpfs_bytes(pids: list[int], paths: tuple[str, ...]) -> int:
    """Bytes written to the sandbox's own tmpfs mounts at `paths` (files there hold memory that no process's
    resident size shows), seen through the first of `pids` whose root the caller can reach; mounts that are
    the caller's own (the fallback without a mount namespace) are not the sandbox's and count nothing."""
    for pid in pids:
        used = 0
        try:
            for path in paths:
                inside, ours = os.statvfs(f"/proc/{pid}/root{path}"), os.statvfs(path)
                if inside.f_fsid != ours.f_fsid:
                    used += (inside.f_blocks - inside.f_bfree) * inside.f_frsize
        except OSError:
            continue
        return used
    return 0


_NAMESPACES = (("user", "userns"), ("net", "netns"), ("pid", "pidns"), ("ipc", "ipcns"), ("mnt", "mntns"))


def read_only_outside(pid: int, writable: tuple[str, ...]) -> bool:
    """Whether every mount `pid` sees is read-only but its private ones: the tmpfs mounts at `writable`, a
    /proc of its own and the device nodes bound into /dev (and False if its mount table cannot be read)."""
    try:
        table = mounts.mount_table(pid)
    except (OSError, ValueError, IndexError):
        return False
    devices = {f"/dev/{name}" for name in mounts.DEVICES}
    return all("ro" in options.split(",") or (point in writable and fstype == "tmpfs") or point in devices
               or (point == "/proc" and fstype == "proc") for point, fstype, options in table)


def confinement(pid: int, writable: tuple[str, ...]) -> list[str]:
    """What confines `pid`, as the caller's /proc shows it: the namespaces it does not share with the caller, a
    /proc of its own (another procfs instance: another device), every mount read-only but its own at
    `writable`, a seccomp filter, no root uid."""
    seen = []
    for name, label in _NAMESPACES:
        try:
            if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
                seen.append(label)
        except OSError:
            pass
    try:
        if os.stat(f"/proc/{pid}/root/proc").st_dev != os.stat("/proc").st_dev:
            seen.append("private-proc")
    except OSError:
        pass
    if "private-proc" in seen and read_only_outside(pid, writable):
        seen.append("read-only-fs")
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        status = ""
    if "\nSeccomp:\t2" in status:
        seen.append("seccomp")
    if any(line.startswith("Uid:") and "0" not in line.split()[1:] for line in status.splitlines()):
        seen.append("non-root")
    return seen


def identities(pids: list[int]) -> list[tuple[int, bytes]]:
    """(pid, start time) pairs: a pid the kernel reuses for another process later no longer matches."""
    found = []
    for pid in pids:
        if (fields := _stat_fields(pid)) is not None and len(fields) > 19:
            found.append((pid, fields[19]))
    return found


def alive(identified: list[tuple[int, bytes]]) -> list[int]:
    """The pids of `identified` still running as the same processes (zombies count as gone)."""
    return [pid for pid, start in identified if (f := _stat_fields(pid)) is not None and f[19:20] == [start]]


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_until_gone(find: Callable[[], list[int]], patience_s: float = 5.0) -> list[int]:
    """SIGKILL whatever `find()` returns until it returns nothing; the survivors if patience runs out."""
    deadline = time.monotonic() + patience_s
    while (pids := find()) and time.monotonic() < deadline:
        kill(pids)
        time.sleep(0.002)
    return pids

"""Which isolation runs a program: bubblewrap where it works, else the process fallback, and the rules between.

`bwrap` gives the program a read-only view of the system's /usr and of the interpreter alone (no checkout, no
home directory, no results files, no /etc beyond the loader cache), a private size-bounded /tmp and /dev/shm as
its only writable places, a /proc of its own with /proc/sys read-only, and new pid, network, ipc, uts and cgroup
namespaces (and a user namespace, started by a user); it runs as an unprivileged uid, dies with its parent and
runs in its own session. The `process` fallback is a child process with rlimits and, where the kernel allows
(`confine.namespaces`), network, pid, ipc and mount namespaces in which every mount is read-only but a private
/tmp and /dev/shm, with a /proc and /dev of its own (`mounts`); a root caller's runs as a uid of its own. Both
install the same seccomp filter (`confine`). `auto` takes bwrap when it works, refuses
on a GPU node (shared machines, where a run must not be able to touch other users' files), and elsewhere falls
back to `process` with one warning naming what that does not contain. docs/sandbox.md has the whole table.
"""

from __future__ import annotations

import functools
import glob
import os
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mdmkit.sandbox import confine, mounts
from mdmkit.sandbox.limits import ISOLATION_ENV, UnsafeExecutionError

_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_warned = threading.Event()


@dataclass(frozen=True)
class Backend:
    """How programs start: `bwrap` or the `process` fallback."""

    name: str

    @property
    def fallback(self) -> bool:
        return self.name == "process"


BWRAP, PROCESS = Backend("bwrap"), Backend("process")


def interpreter() -> tuple[str, str]:
    """(the bare interpreter, its installation prefix): the venv's base Python, which the sandbox may see."""
    executable = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(executable), os.path.realpath(sys.base_prefix)


def bwrap_argv(disk_mb: int, root: bool | None = None) -> list[str]:
    """bubblewrap's options up to the command (which follows).

    Started by an unprivileged user, bwrap maps the sandbox's uid 65534 to that user. Started by root it would
    map it to host root, which owns /proc/sys; so root's bwrap makes no user namespace and keeps only the
    capabilities to change uid, which the sandbox's start-up uses at once to become an unprivileged host uid
    (`confine.drop_privileges`) before any candidate code runs. /proc/sys and /proc/sysrq-trigger are
    read-only in every case.
    """
    root = os.geteuid() == 0 if root is None else root
    size = str(disk_mb * 1024 * 1024)
    if root:
        argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:  # merged-/usr systems link these into /usr; others have real directories
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    _, prefix = interpreter()
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        for parent in reversed(Path(prefix).parents[:-1]):  # searchable by the sandbox's unprivileged uid
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--tmpfs", "/dev"]  # a /dev of a few devices: no /dev/zero, whose shared mappings no RSS shows
    for name in mounts.DEVICES:
        argv += ["--dev-bind-try", f"/dev/{name}", f"/dev/{name}"]
    for name, target in mounts.LINKS:
        argv += ["--symlink", target, f"/dev/{name}"]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc",
             "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
             "--size", size, "--perms", "1777", "--tmpfs", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", "/tmp", "--"]
    return argv


@functools.lru_cache(maxsize=1)
def bwrap_status() -> tuple[bool, str]:
    """(whether bwrap runs the interpreter here, why not): one probe per process."""
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    python, _ = interpreter()
    try:
        probe = subprocess.run(bwrap_argv(1) + [python, "-I", "-S", "-c", "pass"], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bwrap does not start: {error}"
    if probe.returncode != 0:
        line = (probe.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        return False, f"bwrap fails here ({line}); user namespaces may be disabled"
    return True, ""


def available() -> str:
    """The strongest mode that runs here: `bwrap` where it works, else `process` (which never refuses)."""
    return "bwrap" if bwrap_status()[0] else "process"


def gpu_node() -> bool:
    """A machine with an NVIDIA or AMD GPU: shared nodes, where the fallback is refused unless asked for."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd") or bool(glob.glob("/dev/nvidia[0-9]*"))


@functools.lru_cache(maxsize=1)
def fallback_namespaces() -> bool:
    """Whether the process fallback gets its network, pid, ipc and mount namespaces here (a user also needs a
    user namespace of its own): one probe per process, since container runtimes may refuse `unshare`."""
    flags = confine.namespace_flags(os.geteuid())
    python, _ = interpreter()
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare({flags}) != 0)"
    try:
        probe = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, timeout=30, check=False)
        return probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def not_contained() -> str:
    """What the process fallback does not contain, for this user on this machine."""
    if fallback_namespaces():
        return "file-system reads outside /tmp wherever the sandbox's uid may (every mount is read-only)"
    root = os.geteuid() == 0
    writes = "where every user may" if root else "anywhere this user may"
    gaps = [f"file-system reads anywhere its uid may and writes {writes}",
            "files left in /dev/shm", "shared /dev/zero mappings (uncounted without a cgroup)",
            "children that setsid() and double-fork (they outlive the run)"]
    if not root:  # a root caller's sandbox runs as a uid of its own, which reaches none of the caller's processes
        gaps += ["the caller's /proc (its environment and memory)",
                 "signals to the caller and other processes of this user"]
    if platform.machine() not in confine.ARCHES:
        gaps.append("sockets to the caller's loopback (no seccomp filter for this architecture)")
    return "; ".join(gaps)


def resolve(isolation: str) -> Backend:
    """The backend for `isolation` (auto | bwrap | process), or `UnsafeExecutionError` saying what to do."""
    if isolation == "process":
        _warn_once("isolation=process was asked for")
        return PROCESS
    usable, why = bwrap_status()
    if usable:
        return BWRAP
    if isolation == "bwrap":
        raise UnsafeExecutionError(f"sandbox isolation=bwrap, but {why}")
    if gpu_node():
        raise UnsafeExecutionError(
            f"refusing to run generated code on a GPU node without real isolation: {why}; install bubblewrap, "
            f"or set {ISOLATION_ENV}=process to accept the weaker process sandbox (docs/sandbox.md)")
    _warn_once(why)
    return PROCESS


def _warn_once(why: str) -> None:
    if not _warned.is_set():
        _warned.set()
        print(f"mdmkit sandbox: {why}; generated code runs in the weaker process sandbox, which does NOT contain: "
              f"{not_contained()} (docs/sandbox.md)", file=sys.stderr, flush=True)


def describe(isolation: str | None = None) -> str:
    """One line on what `isolation` (default: $MDMKIT_SANDBOX_ISOLATION or auto) amounts to on this machine."""
    from mdmkit.sandbox import cgroups

    mode = isolation or os.environ.get(ISOLATION_ENV, "auto")
    usable, why = bwrap_status()
    cgroup, no_cgroup = cgroups.parent()
    limits = f"cgroup memory and pids limits ({cgroup})" if cgroup else f"rlimits and a /proc watchdog ({no_cgroup})"
    if mode != "process" and usable:
        return f"bwrap (read-only system, private /tmp, no network, new namespaces) with {limits}"
    if mode == "bwrap" or (mode == "auto" and gpu_node()):
        return f"refused: {why}"
    return f"process fallback ({why or 'asked for'}) with {limits}; not contained: {not_contained()}"

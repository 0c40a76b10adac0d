"""Host uids for a root caller's sandboxes: one per sandbox, never handed out again while anything of it remains.

A root caller's sandbox (bwrap or the fallback) runs as a host uid that no account uses, so the kernel's
per-user accounting (`RLIMIT_NPROC`, pipe buffers) counts one sandbox alone and nothing one sandbox leaves
under its uid can reach another. The uids are drawn from one counter per machine: a file in
$MDMKIT_SANDBOX_STATE_DIR (default /run/mdmkit), read and advanced under an exclusive lock, so that several
evaluations, torchrun ranks or threads never draw the same uid. Each process reserves a block of
`BLOCK` at a time (a fork reserves its own). The range holds 2**31 uids: a uid comes round again only after
2**31 later sandboxes on the machine, and then only if no process runs as it. Nothing else of a sandbox
outlives it under its uid: keyrings are refused to it, System V and POSIX IPC objects too, and with its mount
namespace it writes files only to tmpfs mounts that end with it (docs/sandbox.md).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from mdmkit.sandbox.limits import UnsafeExecutionError

STATE_ENV = "MDMKIT_SANDBOX_STATE_DIR"
FIRST_UID = 2_000_000_000  # above every account; FIRST_UID + UID_RANGE stays below the invalid uid 2**32 - 1
UID_RANGE = 2**31
BLOCK = 64

_lock = threading.Lock()
_reserved: dict[tuple[str, int], list[int]] = {}  # (counter file, pid) -> [next draw, end of the block]


def counter_file() -> Path:
    return Path(os.environ.get(STATE_ENV) or "/run/mdmkit") / "sandbox-uids"


def _reserve(path: Path) -> int:
    """Advance the machine's counter by one block; its first draw."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise UnsafeExecutionError(
            f"cannot keep the sandbox uid counter at {path} ({error.strerror}); set {STATE_ENV} to a directory "
            "that every evaluation on this machine shares") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        first = int(text) if text.isdigit() else 0
        record = str(first + BLOCK).encode()
        os.pwrite(fd, record.ljust(32), 0)
        return first
    finally:
        os.close(fd)


def _running_as(uid: int) -> bool:
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if any(line.startswith("Uid:") and str(uid) in line.split()[1:] for line in status.splitlines()):
            return True
    return False


def allocate() -> int:
    """A host uid for one sandbox, unique on this machine (see the module's docstring)."""
    path = counter_file()
    with _lock:
        while True:
            block = _reserved.setdefault((str(path), os.getpid()), [0, 0])
            if block[0] >= block[1]:
                block[0] = _reserve(path)
                block[1] = block[0] + BLOCK
            draw = block[0]
            block[0] += 1
            uid = FIRST_UID + draw % UID_RANGE
            if draw < UID_RANGE or not _running_as(uid):  # a later lap skips a uid something still runs as
                return uid

"""The process fallback's file system, built by its trusted start-up in its own mount namespace.

Shipped with `confine` (standard library only). Every mount the namespace inherited becomes read-only, per mount
(the host's own mounts stay as they are): a program writes no host file, no kernel setting under /sys and no
cgroup's `cgroup.procs`, even as root. Writable are only private, size-bounded tmpfs mounts on /tmp (and the
working directory) and /dev/shm. /dev is rebuilt with the devices programs use (no /dev/zero, whose shared
mappings no resident size shows, and no GPU), and /proc is a fresh one that shows only the sandbox, its
/proc/sys read-only. A root caller's sandbox then runs as another uid, which must reach the interpreter: an
ancestor of its prefix that only its owner may enter (/root) is covered by a read-only tmpfs that holds just
the path down to the prefix.
"""

from __future__ import annotations

import os

from mdmkit.sandbox.confine import check, libc

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 0x400, 0x800, 0x1000, 0x2000, 0x4000
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x40000, 0x200000, 0x1000000
# A mount's own options in /proc/self/mountinfo; a remount inside a user namespace must keep them.
_OPTIONS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
            "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
DEVICES = ("null", "full", "random", "urandom")
LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
          ("stderr", "/proc/self/fd/2"))
_REPLACED = ("/tmp", "/dev", "/proc")  # covered by mounts of the sandbox's own: what was there is hidden


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc().mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _unescape(path: str) -> str:
    """A mount point as mountinfo writes it (space, tab, newline and backslash as octal escapes)."""
    for code in ("040", "011", "012", "134"):
        path = path.replace("\\" + code, chr(int(code, 8)))
    return path


def mount_table(pid: int | str = "self") -> list[tuple[str, str, str]]:
    """(mount point, file system type, the mount's own options) of every mount `pid` can reach: not those
    another mount covers (at the same point, on top of it), nor those beneath a covered one."""
    rows: dict[str, tuple[str, str, str, str]] = {}
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            rows[fields[0]] = (fields[1], _unescape(fields[4]), fields[fields.index("-") + 1], fields[5])
    covered = {parent for parent, point, _, _ in rows.values() if parent in rows and rows[parent][1] == point}

    def reachable(mount_id: str) -> bool:
        while mount_id in rows:
            if mount_id in covered:
                return False
            mount_id = rows[mount_id][0]
        return True

    return [row[1:] for mount_id, row in rows.items() if reachable(mount_id)]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _read_only_inherited(keep: tuple[str, ...]) -> None:
    """Remount every inherited mount read-only (keeping its own options), except those the sandbox covers."""
    for point, _, joined in mount_table():
        if _under(point, keep):
            continue
        options = joined.split(",")
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | (0 if {"noatime", "relatime"} & set(options) else MS_STRICTATIME)
        for option in options:
            flags |= _OPTIONS.get(option, 0)
        try:
            _mount("none", point, None, flags)
        except OSError:  # hidden or gone; the caller reads the sandbox's mount table and reports what held
            pass


def _reach(prefix: str) -> None:
    """Let any uid reach `prefix`: cover its topmost ancestor that others may not enter with a read-only tmpfs
    holding only the path down to it, the prefix bound there again."""
    parts = prefix.strip("/").split("/")
    ancestors = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
    blocked = next((path for path in ancestors if not os.stat(path).st_mode & 0o001), None)
    if blocked is None:
        return
    handle = os.open(prefix, os.O_PATH)  # the prefix, still reachable once its ancestor is covered
    try:
        _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for path in ancestors[ancestors.index(blocked) + 1:] + [prefix]:
            os.mkdir(path)
            os.chmod(path, 0o755)  # whatever the umask
        _mount(f"/proc/self/fd/{handle}", prefix, None, MS_BIND | MS_REC)
        _mount("none", blocked, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        os.close(handle)


def _fresh_dev(size: str) -> None:
    """A /dev of a few bound device nodes, links to /proc/self/fd and a private /dev/shm, built aside in /tmp
    and moved into place."""
    stage = "/tmp/.dev"
    os.mkdir(stage)
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
    for name in filter(lambda name: os.path.exists(f"/dev/{name}"), DEVICES):
        open(f"{stage}/{name}", "w").close()
        _mount(f"/dev/{name}", f"{stage}/{name}", None, MS_BIND)
    for name, target in LINKS:
        os.symlink(target, f"{stage}/{name}")
    os.mkdir(f"{stage}/shm")
    _mount("tmpfs", f"{stage}/shm", "tmpfs", MS_NOSUID | MS_NODEV, size)
    _mount(stage, "/dev", None, MS_MOVE)
    os.rmdir(stage)
    _mount("none", "/dev", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def private_view(workdir: str, disk_mb: int, prefix: str, reach: bool = False) -> None:
    """Build the fallback's file system (this process is pid 1 of its new pid namespace); `reach`: make the
    interpreter's `prefix` reachable for the unprivileged uid a root caller's sandbox becomes."""
    size = f"size={disk_mb}m,mode=1777"
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _read_only_inherited(keep=_REPLACED + (workdir,))
    if reach:
        _reach(prefix)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
    _fresh_dev(size)
    # A /proc that shows only this pid namespace, its kernel settings read-only. A container that masks parts of
    # its /proc refuses a new one inside a user namespace: the host's stays (the caller then reports no
    # "private-proc"; docs/sandbox.md).
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    else:
        for path in filter(os.path.exists, ("/proc/sys", "/proc/sysrq-trigger")):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(path, path, None, MS_BIND | MS_REC | MS_REMOUNT | MS_RDONLY)
    os.makedirs(workdir, exist_ok=True)
    if not _under(os.path.realpath(workdir), ("/tmp",)):
        _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size)

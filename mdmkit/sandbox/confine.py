"""The candidate's side of confinement, run by the sandbox's own trusted start-up before any candidate code.

Shipped with `codec` and `child` (standard library only; Linux system calls through ctypes). Three jobs:
- `namespaces` (process fallback only): new user (unprivileged callers), network, pid, ipc and mount
  namespaces where the kernel allows them; in the mount namespace a fresh /proc whose /proc/sys is read-only,
  and private size-bounded tmpfs mounts on /tmp, /dev/shm and the working directory.
- `drop_privileges`: under bwrap started by root, leave host root for the unprivileged uid the caller chose;
  in the fallback, give up every capability the namespaces granted, so no mount can be undone.
- `seccomp`: refuse the system calls that create memory no process's resident size shows (memfd, System V
  segments, shared anonymous mappings) and new user namespaces; on other architectures nothing is installed
  and the caller sees no "seccomp" in /proc/<pid>/status.
"""

import ctypes
import errno
import os
import platform
import struct

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_CAPBSET_DROP = 38, 22, 2, 24

# (audit arch, {name: number}) of the architectures whose system call numbers are written down here.
_ARCHES = {
    "x86_64": (0xC000003E, {"mmap": 9, "shmget": 29, "clone": 56, "unshare": 272, "memfd_create": 319,
                            "clone3": 435}),
    "aarch64": (0xC00000B7, {"unshare": 97, "shmget": 194, "clone": 220, "mmap": 222, "memfd_create": 279,
                             "clone3": 435}),
}

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        ulong = ctypes.c_ulong
        _libc.prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ulong, ctypes.c_char_p]
        _libc.capset.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return _libc


def _check(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source, target, fstype, flags, data=None):
    _check(_c().mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                      data.encode() if data else None), f"mount {target}")


def namespace_flags(uid):
    """The namespaces the fallback asks for: network, pid, ipc, mount, and a user namespace for a non-root uid."""
    return CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS | (CLONE_NEWUSER if uid != 0 else 0)


def namespaces(workdir, disk_mb):
    """Process fallback: new namespaces where the kernel allows them all (else none; a user needs a user
    namespace too); returns what the first process of the new pid namespace calls to mount its private file
    systems."""
    libc = _c()
    uid, gid = os.getuid(), os.getgid()
    flags = namespace_flags(uid)
    if libc.unshare(flags) != 0:  # all or none: the caller reads in /proc which the sandbox got
        flags = 0
    if flags & CLONE_NEWUSER:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)

    def mount_private():
        if not flags:
            return
        size = f"size={disk_mb}m,mode=1777"
        _mount("none", "/", None, MS_REC | MS_PRIVATE)
        # This process is pid 1 of the new namespace: a /proc that shows only it, its kernel settings read-only.
        # A container that masks parts of its /proc refuses a new one inside a user namespace: the host's stays
        # (the caller then reports no "private-proc"; docs/sandbox.md).
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            pass
        else:
            for path in filter(os.path.exists, ("/proc/sys", "/proc/sysrq-trigger")):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(path, path, None, MS_BIND | MS_REC | MS_REMOUNT | MS_RDONLY)
        for path in ("/tmp", "/dev/shm"):
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, size)
        os.makedirs(workdir, exist_ok=True)
        if not os.path.realpath(workdir).startswith("/tmp/"):
            _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size)
        os.chdir(workdir)

    return mount_private


def drop_privileges(uid=None):
    """Become `uid` (root caller under bwrap), or keep the uid and drop every capability (the fallback)."""
    libc = _c()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to all-non-root ids: the kernel clears every capability
        return
    for cap in range(64):  # the bounding set, while CAP_SETPCAP is still held; unknown numbers fail harmlessly
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = ctypes.create_string_buffer(24)  # effective, permitted, inheritable: two 32-bit words each, all zero
    _check(libc.capset(header, data), "capset")


def _filter(arch, numbers):
    """A classic BPF program: refuse the listed calls with EPERM (clone3 with ENOSYS, so libc falls back to
    clone, whose flags the filter can read), allow everything else."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, enosys, eperm = 0x7FFF0000, 0x00050000 | errno.ENOSYS, 0x00050000 | errno.EPERM

    def args_low(i):  # seccomp_data.args[i], its low 32 bits (little-endian)
        return 16 + 8 * i

    code = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, 0x80000000),  # another ABI: kill the process
            (ld, 0, 0, 0), (jset, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # x32 system calls: refused
    code += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys)]
    for name in ("memfd_create", "shmget"):
        code += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, eperm)]
    for name, arg, mask in (("unshare", 0, CLONE_NEWUSER), ("clone", 0, CLONE_NEWUSER)):
        code += [(jeq, 0, 3, numbers[name]), (ld, 0, 0, args_low(arg)), (jset, 0, 1, mask), (ret, 0, 0, eperm),
                 (ld, 0, 0, 0)]
    code += [(jeq, 0, 4, numbers["mmap"]), (ld, 0, 0, args_low(3)), (0x54, 0, 0, MAP_SHARED | MAP_ANONYMOUS),
             (jeq, 0, 1, MAP_SHARED | MAP_ANONYMOUS), (ret, 0, 0, eperm)]
    code += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *op) for op in code), len(code)


def seccomp():
    """Install the filter (for this process and every child it will have); False where the architecture's
    system call numbers are not written down here."""
    known = _ARCHES.get(platform.machine())
    if known is None:
        return False
    program, count = _filter(*known)
    buffer = ctypes.create_string_buffer(program)
    fprog = ctypes.create_string_buffer(struct.pack("@HP", count, ctypes.addressof(buffer)))  # sock_fprog
    libc = _c()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")
    return True

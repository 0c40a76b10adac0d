"""The candidate's side of confinement, run by the sandbox's own trusted start-up before any candidate code.

Shipped with `codec`, `mounts` and `child` (standard library only; Linux system calls through ctypes). Jobs:
- `namespaces` (process fallback only): new user (unprivileged callers), network, pid, ipc and mount
  namespaces where the kernel allows them (`mounts` then builds the file system the program sees).
- `drop_privileges`: a root caller's sandbox (either mode) leaves host root for the unprivileged uid the caller
  allocated for it alone; a user's fallback gives up every capability its namespaces granted, so no mount can
  be undone.
- `fresh_keyring`: a new, empty session keyring, so that no key of the caller's session is the sandbox's.
- `seccomp`: refuse the system calls that hold memory no process's resident size shows (memfd and secret
  memory, System V and POSIX IPC objects, socket buffers, io_uring rings), reach kernel keyrings, watch file
  activity on the host's bound directories, or make user namespaces; on other architectures nothing is
  installed and the caller sees no "seccomp" in /proc/<pid>/status.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_CAPBSET_DROP = 38, 22, 2, 24

KEYCTL_JOIN_SESSION_KEYRING = 1

# (audit arch, {name: number}) of the architectures whose system call numbers are written down here (x86-64's
# own table; arm64 uses the generic one, which has no inotify_init).
ARCHES = {
    "x86_64": (0xC000003E, {
        "mmap": 9, "shmget": 29, "socket": 41, "socketpair": 53, "clone": 56, "semget": 64, "msgget": 68,
        "mq_open": 240, "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253, "unshare": 272,
        "inotify_init1": 294, "fanotify_init": 300, "memfd_create": 319, "io_uring_setup": 425, "clone3": 435,
        "memfd_secret": 447}),
    "aarch64": (0xC00000B7, {
        "inotify_init1": 26, "unshare": 97, "mq_open": 180, "msgget": 186, "semget": 190, "shmget": 194,
        "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220,
        "mmap": 222, "fanotify_init": 262, "memfd_create": 279, "io_uring_setup": 425, "clone3": 435,
        "memfd_secret": 447}),
}
# Refused with EPERM whatever their arguments. Memory outside every resident size: memfd, secret memory, System
# V segments, semaphore sets and message queues, POSIX message queues, io_uring rings, and socket buffers (a
# socket pair queues hundreds of kB; code tasks need no socket, and the sandbox speaks over pipes). Kernel
# keyrings: the caller's keys, and keys a sandbox would leave under its uid for a later one. inotify and
# fanotify: other processes' file activity under the bound host directories.
REFUSED = ("memfd_create", "memfd_secret", "shmget", "semget", "msgget", "mq_open", "io_uring_setup", "socket",
           "socketpair", "add_key", "request_key", "keyctl", "inotify_init", "inotify_init1", "fanotify_init")

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        ulong = ctypes.c_ulong
        _libc.prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ulong, ctypes.c_char_p]
        _libc.capset.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return _libc


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def namespace_flags(uid: int) -> int:
    """The namespaces the fallback asks for: network, pid, ipc, mount, and a user namespace for a non-root uid."""
    return CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS | (CLONE_NEWUSER if uid != 0 else 0)


def namespaces() -> bool:
    """Process fallback: new namespaces where the kernel allows them all (else none; a user needs a user
    namespace too); whether it did. The first process forked after this is pid 1 of the new pid namespace."""
    uid, gid = os.getuid(), os.getgid()
    flags = namespace_flags(uid)
    if libc().unshare(flags) != 0:  # all or none: the caller reads in /proc which the sandbox got
        return False
    if flags & CLONE_NEWUSER:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return True


def drop_privileges(uid: int | None = None) -> None:
    """Become `uid` (a root caller's sandbox), or keep the uid and drop every capability (a user's fallback)."""
    check(libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to all-non-root ids: the kernel clears every capability
        stdlib = os.path.dirname(os.__file__)
        if not os.access(stdlib, os.R_OK | os.X_OK):
            raise PermissionError(f"uid {uid} cannot read the interpreter's standard library {stdlib} (no mount "
                                  "namespace to make it reachable: use bwrap, or an interpreter every user may read)")
        return
    for cap in range(64):  # the bounding set, while CAP_SETPCAP is still held; unknown numbers fail harmlessly
        libc().prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = ctypes.create_string_buffer(24)  # effective, permitted, inheritable: two 32-bit words each, all zero
    check(libc().capset(header, data), "capset")


def fresh_keyring() -> bool:
    """Join a new, empty session keyring (the caller's is inherited otherwise). False where the kernel has no
    keyrings or refuses the call; the filter refuses every keyring call to the candidate either way."""
    number = ARCHES.get(platform.machine(), (0, {}))[1].get("keyctl")
    return number is not None and libc().syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def _filter(arch: int, numbers: dict[str, int]) -> tuple[bytes, int]:
    """A classic BPF program: refuse the listed calls with EPERM (clone3 with ENOSYS, so libc falls back to
    clone, whose flags the filter can read), allow everything else."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, enosys, eperm = 0x7FFF0000, 0x00050000 | errno.ENOSYS, 0x00050000 | errno.EPERM

    def args_low(i: int) -> int:  # seccomp_data.args[i], its low 32 bits (little-endian)
        return 16 + 8 * i

    code = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, 0x80000000),  # another ABI: kill the process
            (ld, 0, 0, 0), (jset, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # x32 system calls: refused
    code += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys)]
    for name in filter(numbers.__contains__, REFUSED):
        code += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, eperm)]
    for name, arg, mask in (("unshare", 0, CLONE_NEWUSER), ("clone", 0, CLONE_NEWUSER)):
        code += [(jeq, 0, 3, numbers[name]), (ld, 0, 0, args_low(arg)), (jset, 0, 1, mask), (ret, 0, 0, eperm),
                 (ld, 0, 0, 0)]
    code += [(jeq, 0, 4, numbers["mmap"]), (ld, 0, 0, args_low(3)), (0x54, 0, 0, MAP_SHARED | MAP_ANONYMOUS),
             (jeq, 0, 1, MAP_SHARED | MAP_ANONYMOUS), (ret, 0, 0, eperm)]
    code += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *op) for op in code), len(code)


def seccomp() -> bool:
    """Install the filter (for this process and every child it will have); False where the architecture's
    system call numbers are not written down here."""
    known = ARCHES.get(platform.machine())
    if known is None:
        return False
    program, count = _filter(*known)
    buffer = ctypes.create_string_buffer(program)
    fprog = ctypes.create_string_buffer(struct.pack("@HP", count, ctypes.addressof(buffer)))  # sock_fprog
    check(libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")
    return True

"""The sandbox's third audit: kernel keyrings, one host uid per sandbox, memory a watchdog cannot see, the
fallback's host writes and cgroup escape, and file-activity watches. Each test failed on the code before it.

As in the earlier passes every attack is bounded and probes the host only harmlessly: files are opened for
writing and closed without a byte written, cgroup.procs files too; a key the test plants is removed again. The
bounded decoding of replies is tested in test_sandbox_decoding.py.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import FALLBACK_NS, ROOT, ROOT_USER, SECCOMP, contained, held_together, limits, run

from mdmkit.sandbox import cgroups, run_many, uids

pytestmark = pytest.mark.usefixtures("allow_code_execution")

MACHINE = os.uname().machine
KEY_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request_key, keyctl
SESSION, USER = -3, -4  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
KEYCTL_UPDATE, KEYCTL_UNLINK, KEYCTL_INVALIDATE, KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_JOIN = 2, 9, 21, 10, 11, 1
needs_keyrings = pytest.mark.skipif(MACHINE not in KEY_CALLS, reason=f"no keyring call numbers for {MACHINE}")


# --- kernel keyrings ------------------------------------------------------------------------------------------

def _keyctl(*args: int | bytes | None) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(KEY_CALLS[MACHINE][2], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])


def _search(keyring: int, description: str) -> int:
    return _keyctl(KEYCTL_SEARCH, keyring, b"user", description.encode(), 0)


def _read(key: int) -> bytes:
    buffer = ctypes.create_string_buffer(64)
    size = _keyctl(KEYCTL_READ, key, buffer, 64)
    return buffer.raw[:size] if size >= 0 else b""


def _remove(keyring: int, description: str) -> None:
    for _ in range(10):  # bounded: a key this process may find but not unlink stays (and fails the test)
        if (key := _search(keyring, description)) < 0:
            return
        _keyctl(KEYCTL_UNLINK, key, keyring)


@pytest.fixture
def caller_key(marker: str) -> Iterator[tuple[int, str]]:
    """A secret in a new session keyring of this test process: (its serial, its description)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if _keyctl(KEYCTL_JOIN, None) < 0:
        pytest.skip(f"the kernel refuses keyrings to this process (errno {ctypes.get_errno()})")
    description = f"{marker}-secret"
    key = libc.syscall(KEY_CALLS[MACHINE][0], b"user", description.encode(), b"secret", 6, ctypes.c_long(SESSION))
    assert key >= 0, ctypes.get_errno()
    yield key, description
    _keyctl(KEYCTL_INVALIDATE, key)
    for keyring in (SESSION, USER):
        _remove(keyring, f"{marker}-planted")


def _key_program(calls: str) -> str:
    return (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"add_key, request_key, keyctl = {KEY_CALLS[MACHINE]!r}\n"
        "def report(what, result, buffer=None):\n"
        "    print(what, result if result >= 0 else -ctypes.get_errno(), flush=True)\n"
        "    return result\n"
        "def c(n):\n    return ctypes.c_long(n)\n"
        + calls
    )


@needs_keyrings
def test_a_program_can_neither_read_nor_write_the_callers_keys(mode, caller_key, marker):
    key, description = caller_key
    calls = (
        f"found = report('search', libc.syscall(keyctl, c({KEYCTL_SEARCH}), c({SESSION}), b'user', "
        f"{description.encode()!r}, c(0)))\n"
        "buffer = ctypes.create_string_buffer(64)\n"
        f"size = report('read', libc.syscall(keyctl, c({KEYCTL_READ}), c({key}), buffer, c(64)))\n"
        "print('payload', buffer.raw[:max(size, 0)])\n"
        f"report('request', libc.syscall(request_key, b'user', {description.encode()!r}, None, c(0)))\n"
        f"report('update', libc.syscall(keyctl, c({KEYCTL_UPDATE}), c({key}), b'pwned', c(5)))\n"
        f"for keyring in ({SESSION}, {USER}):\n"
        f"    report('plant', libc.syscall(add_key, b'user', {marker.encode() + b'-planted'!r}, b'pwned', c(5), "
        "c(keyring)))\n"
    )
    result = run(mode, _key_program(calls))
    assert result.passed, result.reason
    assert _read(key) == b"secret" and "secret" not in result.stdout, result.stdout  # unread and unchanged
    assert all(_search(keyring, f"{marker}-planted") < 0 for keyring in (SESSION, USER)), "a key was planted"
    if SECCOMP:  # every keyring call refused outright (EPERM)
        assert result.stdout.count(" -1\n") == 6, result.stdout


@needs_keyrings
def test_no_key_left_by_one_sandbox_reaches_a_later_one(mode, marker):
    name = f"{marker}-left".encode()
    leave = _key_program(f"for keyring in ({SESSION}, {USER}):\n"
                         f"    report('leave', libc.syscall(add_key, b'user', {name!r}, b'left', c(4), c(keyring)))\n")
    find = _key_program(f"for keyring in ({SESSION}, {USER}):\n"
                        f"    report('find', libc.syscall(keyctl, c({KEYCTL_SEARCH}), c(keyring), b'user', {name!r}, "
                        "c(0)))\n")
    try:
        first, later = run(mode, leave), run(mode, find)
    finally:
        _remove(USER, name.decode())  # where a key was left in this user's keyring after all
    assert first.passed and later.passed, (first.reason, later.reason)
    assert all(int(line.split()[1]) < 0 for line in later.stdout.splitlines()), later.stdout


# --- one identity per sandbox ---------------------------------------------------------------------------------

@pytest.mark.skipif(not ROOT_USER, reason="only a root caller hands its sandboxes host uids (a user's keep its own)")
@pytest.mark.parametrize("mode", ["process", pytest.param("bwrap", marks=pytest.mark.slow)], indirect=True)
def test_a_thousand_and_one_sandboxes_of_a_root_caller_never_share_a_uid(mode):
    programs = ["import os\nprint(os.getuid(), os.getgid())\n"] * 1001  # the audit's 1,001st reused the 1st's uid
    results = run_many(programs, limits(mode, timeout_s=30.0), workers=2, progress=False)
    assert all(r.passed for r in results), next(r.reason for r in results if not r.passed)
    ids = [tuple(map(int, r.stdout.split())) for r in results]
    assert all(uid == gid >= uids.FIRST_UID for uid, gid in ids)
    assert len({uid for uid, _ in ids}) == 1001


@pytest.mark.slow
@pytest.mark.skipif(not ROOT_USER, reason="only a root caller hands its sandboxes host uids (a user's keep its own)")
def test_two_evaluations_at_once_never_share_a_uid(mode):
    """Two processes of 1,001 programs each, at the same time, as two evaluations or torchrun ranks would."""
    code = ("import os, sys\nos.environ['MDMKIT_ALLOW_CODE_EXECUTION'] = '1'\n"
            "from mdmkit.sandbox import SandboxLimits, run_many\n"
            "results = run_many(['import os\\nprint(os.getuid())\\n'] * 1001, "
            f"SandboxLimits(isolation={mode!r}, timeout_s=30.0), workers=1, progress=False)\n"
            "print(*[r.stdout.strip() or r.reason for r in results])\n")
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
            for _ in range(2)]
    drawn = [run.communicate(timeout=1800)[0].split() for run in runs]
    assert all(run.returncode == 0 for run in runs) and all(len(d) == 1001 for d in drawn), drawn
    assert len(set(drawn[0]) | set(drawn[1])) == 2002 and all(uid.isdigit() for uid in drawn[0] + drawn[1])


def test_the_uid_counter_hands_out_each_uid_once_across_threads_and_processes(tmp_path, monkeypatch):
    monkeypatch.setenv(uids.STATE_ENV, str(tmp_path))
    code = "from mdmkit.sandbox import uids\nprint(*[uids.allocate() for _ in range(3000)])\n"
    others = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
              for _ in range(2)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        here = list(pool.map(lambda _: uids.allocate(), range(3000)))
    drawn = here + [int(uid) for other in others for uid in other.communicate(timeout=600)[0].split()]
    assert all(other.returncode == 0 for other in others)
    assert len(drawn) == 9000 and len(set(drawn)) == 9000 and min(drawn) >= uids.FIRST_UID


@pytest.mark.skipif(not ROOT_USER, reason="making a process of another uid needs root")
def test_a_later_lap_of_the_uid_counter_skips_a_uid_that_still_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(uids.STATE_ENV, str(tmp_path))
    uids.counter_file().parent.mkdir(exist_ok=True)
    uids.counter_file().write_text(str(uids.UID_RANGE))  # the counter's second lap starts at FIRST_UID again
    holder = subprocess.Popen(["sleep", "60"], user=uids.FIRST_UID, group=uids.FIRST_UID)
    try:
        assert uids.allocate() == uids.FIRST_UID + 1
    finally:
        holder.kill()
        holder.wait()


def test_the_uid_counter_names_its_setting_when_it_cannot_be_kept(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(uids.STATE_ENV, str(blocker / "below"))
    with pytest.raises(uids.UnsafeExecutionError, match=uids.STATE_ENV):
        uids.allocate()
    if ROOT_USER:  # once, before any program runs, not once a program
        with pytest.raises(uids.UnsafeExecutionError, match=uids.STATE_ENV):
            run_many(["pass\n"] * 3, limits("process"), progress=False)


# --- memory a watchdog cannot see -----------------------------------------------------------------------------

HIDDEN = {  # each process tries to hold `per` MB that no resident size shows; `processes` of them against 256 MB
    "memfd_secret": (4, 100, (  # 25 areas of 4 MB (under RLIMIT_MEMLOCK while mapped), unmapped once written
        "import ctypes, mmap\nlibc = ctypes.CDLL(None, use_errno=True)\nkept = []\n"
        "for _ in range(25):\n    fd = libc.syscall(447, 0)\n"
        "    if fd < 0:\n        raise OSError(ctypes.get_errno(), 'memfd_secret')\n"
        "    os.ftruncate(fd, size // 25)\n    area = mmap.mmap(fd, size // 25)\n"
        "    area.write(b'x' * (size // 25))\n    area.close()\n    kept.append(fd)\n")),
    "dev_zero_shared": (4, 100, (  # touched 10 MB at a time by children that exit; the parent never touches it
        "import mmap\nfd = os.open('/dev/zero', os.O_RDWR)\narea = mmap.mmap(fd, size, mmap.MAP_SHARED)\n"
        "for i in range(10):\n    child = os.fork()\n"
        "    if child == 0:\n        area[i * size // 10:(i + 1) * size // 10] = b'x' * (size // 10)\n"
        "        os._exit(0)\n    os.waitpid(child, 0)\n")),
    "socket_buffers": (16, 24, (  # unix socket pairs, both directions filled until they would block
        "import socket\npairs = []\n"
        "for _ in range(24):\n    a, b = socket.socketpair()\n    pairs.append((a, b))\n"
        "    for end in (a, b):\n        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)\n"
        "        end.setblocking(False)\n"
        "        try:\n            while True:\n                end.send(b'x' * 65536)\n"
        "        except BlockingIOError:\n            pass\n")),
}


@pytest.fixture(params=["cgroup", "watchdog"])
def limiter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """What bounds the sandbox's memory: a cgroup (where the caller may make one), or the watchdog alone."""
    if request.param == "cgroup" and cgroups.parent()[0] is None:
        pytest.skip(f"no cgroup here: {cgroups.parent()[1]}")
    if request.param == "watchdog":
        monkeypatch.setattr(cgroups, "parent", lambda: (None, "the test asks for the watchdog"))
    return request.param


@pytest.mark.parametrize("kind", HIDDEN)
def test_memory_that_no_resident_size_shows_is_refused_or_killed(mode, limiter, kind, marker):
    processes, per_mb, body = HIDDEN[kind]
    program = held_together(body, processes, marker, f"size = {per_mb} * 2**20\n", wait_s=4)
    result = run(mode, program, timeout_s=8.0, memory_mb=256, max_processes=4096, max_open_files=64)
    for path in Path("/tmp").glob(f"{marker}-tried-*"):  # on the machine's /tmp where none is private
        path.unlink()
    held = result.stdout.count("held")
    if kind == "dev_zero_shared" and limiter == "watchdog" and mode == "process" and not FALLBACK_NS:
        assert held == processes  # NOT contained: the machine's /dev/zero, uncounted (docs/sandbox.md)
        return
    assert held * per_mb <= 256 + 64 or result.status == "killed", result  # never all of it held unseen
    if SECCOMP and kind != "dev_zero_shared":
        assert result.stdout.count("refused 1") == processes, result.stdout  # EPERM, before any memory
    if kind == "dev_zero_shared" and contained(mode):
        assert result.stdout.count("refused 2") == processes, result.stdout  # no /dev/zero in its /dev


@pytest.mark.skipif(not SECCOMP, reason=f"no seccomp filter for {MACHINE}")
def test_every_call_the_filter_lists_is_refused_with_eperm(mode):
    """Each listed call, made with null arguments (harmless where allowed: EFAULT, EINVAL or a fresh object of the
    sandbox's own), answers EPERM. fanotify_init answers EPERM to any unprivileged caller anyway."""
    from mdmkit.sandbox import confine

    numbers = confine.ARCHES[MACHINE][1]
    calls = {name: numbers[name] for name in confine.REFUSED if name in numbers}
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, number in {calls!r}.items():\n"
        "    result, code = libc.syscall(number, 0, 0, 0, 0, 0), ctypes.get_errno()\n"
        "    print(name, 'EPERM' if result < 0 and code == 1 else f'answered:{result},errno:{code}')\n"
    )
    result = run(mode, program)
    assert result.passed, result.reason
    assert result.stdout.split() == [word for name in calls for word in (name, "EPERM")], result.stdout


# --- the fallback as root: host writes, kernel settings, cgroups ----------------------------------------------

def test_no_program_writes_host_files_kernel_settings_or_cgroup_membership(mode, marker):
    directories = ["/", "/etc", "/usr/bin", str(Path.home()), str(ROOT), os.path.realpath(sys.base_prefix)]
    files = ["/etc/passwd", os.path.realpath(os.__file__), "/dev/kmsg", "/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"]
    program = (
        "import os\n"
        "parents = [line.split(':', 2)[2] for line in open('/proc/self/cgroup').read().splitlines()]\n"
        "mounted = [line.split()[4] for line in open('/proc/self/mountinfo') if ' - cgroup' in line]\n"
        "escape = [f'{m}{os.path.dirname(p)}/cgroup.procs' for m in mounted for p in parents]\n"
        f"for path in {directories!r}:\n"
        f"    try:\n        os.close(os.open(os.path.join(path, {marker!r}), os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n"
        "        print('created', path)\n"
        "    except OSError as e:\n        print('refused', path, e.errno)\n"
        f"for path in {files!r} + escape:\n"
        "    try:\n        os.close(os.open(path, os.O_WRONLY))\n        print('writable', path)\n"
        "    except OSError as e:\n        print('refused', path, e.errno)\n"
    )
    try:
        result = run(mode, program)
    finally:
        for directory in directories:
            Path(directory, marker).unlink(missing_ok=True)
    assert result.passed, result.reason
    reached = [line for line in result.stdout.splitlines() if line.startswith(("created", "writable"))]
    if mode == "process" and not FALLBACK_NS and not ROOT_USER:  # NOT contained: wherever this user may write
        assert all(os.access(line.split(" ", 1)[1], os.W_OK) for line in reached), reached
    else:
        assert reached == [], reached
        assert "non-root" in result.protections and "read-only-fs" in result.protections, result.protections


# --- file activity --------------------------------------------------------------------------------------------

def test_no_program_watches_file_activity_on_the_bound_host_directories(mode):
    program = (
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.inotify_init1(0)\n"
        "if fd < 0:\n    print('refused', ctypes.get_errno())\n"
        "else:\n    print('watch', libc.inotify_add_watch(fd, sys.base_prefix.encode(), 0x20))\n"  # IN_OPEN
    )
    result = run(mode, program)
    assert result.passed, result.reason
    if SECCOMP:
        assert "refused 1" in result.stdout, result.stdout


# --- the limits themselves ------------------------------------------------------------------------------------

def test_threads_probing_for_cgroups_at_once_all_find_them():
    """run_many's first sandboxes start together: their probes clashed, and a run went on without a cgroup
    (the watchdog alone) whenever the losing thread's answer was the one cached."""
    import threading

    place, why = cgroups.parent()
    if place is None:
        pytest.skip(f"no cgroup here: {why}")
    probes = []
    barrier = threading.Barrier(8)

    def probe():
        barrier.wait()
        probes.append(cgroups._creatable(place.memory))

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert probes == [""] * 8, probes

"""The sandbox's second audit: host root, hidden memory, checks that hang or are fooled, replies the program
controls, survivors, and the process fallback's namespaces. Each test failed before the fix it names.

As in test_sandbox.py, every attack is bounded and probes the host only harmlessly: kernel settings are opened
for writing and closed without a byte written, signals are signal 0.
"""

from __future__ import annotations

import glob
import os
import subprocess

import pytest
from sandbox_support import FALLBACK_NS, ROOT_USER, contained, held_together, limits, run

from mdmkit.sandbox import Check, channel, codec, run_many

pytestmark = pytest.mark.usefixtures("allow_code_execution")

KERNEL_SETTINGS = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/core_uses_pid", "/proc/sys/vm/drop_caches",
                   "/proc/sys/kernel/ns_last_pid", "/proc/sysrq-trigger"]


# --- host root and kernel settings ----------------------------------------------------------------------------

def test_no_program_runs_as_host_root_or_writes_kernel_settings(mode):
    program = (
        "import os\n"
        f"for path in {KERNEL_SETTINGS!r}:\n"
        "    try:\n        os.close(os.open(path, os.O_WRONLY))\n        print('writable', path)\n"
        "    except OSError as e:\n        print('refused', path, e.errno)\n"
    )
    result = run(mode, program)
    assert result.passed, result.reason
    out = result.stdout
    if contained(mode):  # /proc/sys and /proc/sysrq-trigger read-only (or absent) in the sandbox's own /proc
        assert "writable" not in out and out.count("refused") == len(KERNEL_SETTINGS), out
    if mode == "bwrap" or not ROOT_USER:  # the caller reads the program's uid in its own /proc: not host root
        assert "non-root" in result.protections, result.protections


# --- memory no resident size shows ----------------------------------------------------------------------------

HIDDEN_MEMORY = {  # each of four processes tries to hold 100 MB (10 x 10 MB) against memory_mb=256
    "memfd": "for _ in range(10):\n    os.write(os.memfd_create('x'), block)\n",  # each under max_file_mb
    "sysv_shm": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "libc.shmat.restype = ctypes.c_void_p\n"
                 "ident = libc.shmget(0, 100 * 2**20, 0o1600)\n"
                 "if ident < 0:\n    raise OSError(ctypes.get_errno(), 'shmget')\n"
                 "address = libc.shmat(ident, None, 0)\nctypes.memset(address, 1, 100 * 2**20)\n"
                 "libc.shmdt(ctypes.c_void_p(address))\n"),
    "shared_anonymous": ("import mmap\narea = mmap.mmap(-1, 100 * 2**20)\n"
                         "child = os.fork()\nif child == 0:\n    area.write(block * 10)\n    os._exit(0)\n"
                         "os.waitpid(child, 0)\n"),
    "dev_shm_files": "for i in range(10):\n    open(f'/dev/shm/{marker}-{os.getpid()}-{i}', 'wb').write(block)\n",
}


@pytest.mark.parametrize("kind", HIDDEN_MEMORY)
def test_memory_that_no_resident_size_shows_is_refused_or_counted(mode, kind, marker):
    program = held_together(HIDDEN_MEMORY[kind], 4, marker, "block = b'x' * 10 * 2**20\n", wait_s=3)
    result = run(mode, program, timeout_s=6.0, memory_mb=256, disk_mb=64, max_processes=4096)
    held = result.stdout.count("held")
    for path in glob.glob(f"/tmp/{marker}-tried-*"):  # left on the machine's /tmp where none is private
        os.unlink(path)
    if kind == "dev_shm_files" and not contained(mode):
        assert held == 4  # NOT contained: without a mount namespace /dev/shm is the machine's (docs/sandbox.md)
        for path in glob.glob(f"/dev/shm/{marker}-*"):
            os.unlink(path)
        return
    # at most 256 MB (memory) + 64 MB (the bounded tmpfs) held at once: never all four processes' 400 MB
    assert held < 4 and (result.status == "killed" or result.stdout.count("refused") >= 4 - held), result


# --- checks that hang or are fooled ---------------------------------------------------------------------------

def test_a_huge_decimal_is_refused_before_the_checks_compute_with_it(mode):
    candidate = "import decimal\ndef lobb_num(n, m):\n    return decimal.Decimal('1e999999999')\n"
    result = run(mode, Check(candidate, "assert int(lobb_num(5, 3)) == 35\n", ("lobb_num",)))
    assert result.status == "failed" and "Decimal of exponent 999999999" in result.reason, result.reason
    honest = "import decimal\ndef lobb_num(n, m):\n    return decimal.Decimal('35.0')\n"
    assert run(mode, Check(honest, "assert int(lobb_num(5, 3)) == 35\n", ("lobb_num",))).passed


def test_decoding_bounds_numbers_and_admits_only_exact_built_in_types():
    for junk in ({"t": "builtin", "v": "__loader__"}, {"t": "builtin", "v": "__build_class__"},
                 {"t": "Decimal", "v": "1e4301"}, {"t": "Decimal", "v": "-1e-5000"}):
        with pytest.raises(codec.WireError):
            codec.from_wire(junk)
    assert codec.from_wire({"t": "builtin", "v": "int"}) is int
    assert str(codec.from_wire({"t": "Decimal", "v": "1e4300"})) == "1E+4300"
    assert codec.unpack(codec.pack([10**4299])[4:]) == [10**4299]
    with pytest.raises(codec.WireError, match="more than 4300 digits"):
        codec.unpack(b"[" + b"9" * 4301 + b"]")


def test_checks_that_loop_on_a_returned_value_stop_at_the_deadline(mode):
    check = Check("def f():\n    return 10 ** 12\n", "for i in range(f()):\n    pass\n", ("f",))
    result = run(mode, check, timeout_s=1.0)
    assert result.status == "timeout" and "the checks ran past" in result.reason, result.reason


def test_the_deadline_tracer_stops_only_past_its_deadline():
    from mdmkit.sandbox.verdict import _deadline_tracer

    class Box:
        def __init__(self):
            self.limits, self.halted = limits("process"), []

        def halt(self, status, reason):
            self.halted.append(status)
            raise channel.Stopped(reason)

    now = [0.0]
    box = Box()
    tracer = _deadline_tracer(box, deadline=10.0, clock=lambda: now[0])
    frame = compile("pass", "<checks>", "exec")
    local = tracer(type("Frame", (), {"f_code": frame})(), "call", None)
    assert local is not None and local(None, "line", None) is local and box.halted == []
    now[0] = 10.5
    with pytest.raises(channel.Stopped, match="the checks ran past"):
        local(None, "line", None)
    assert box.halted == ["timeout"]


@pytest.mark.parametrize("name", ["StopIteration", "StopAsyncIteration", "GeneratorExit"])
def test_control_flow_exceptions_from_the_candidate_fail_the_check(mode, name):
    check = Check(f"def f(x):\n    raise {name}\n", "assert all(map(lambda x: f(x) == x * 2, [1, 2, 3]))\n", ("f",))
    result = run(mode, check)
    assert result.status == "failed" and f"the candidate raised CandidateError: {name}" in result.reason, result


# --- replies the program controls -----------------------------------------------------------------------------

def _patched_reply(field: str) -> str:
    return ("import sys\nchild = sys.modules['mdmkit.sandbox.child']\nwrite = child._write\n"
            f"def forged(fd, message):\n    message['protections'] = {field}\n    write(fd, message)\n"
            "child._write = forged\ndef f(x):\n    return 2 * x\n")


@pytest.mark.parametrize("field", ["['cgroup', 'seccomp', 'forged']", "12345"])
def test_protections_are_what_the_caller_set_up_never_what_the_program_says(mode, field):
    result = run(mode, Check(_patched_reply(field), "assert f(1) == 2\n", ("f",)))
    assert result.passed, result.reason
    assert "forged" not in result.protections and ("seccomp" in result.protections) == (os.uname().machine in (
        "x86_64", "aarch64"))
    assert ("private-proc" in result.protections) == contained(mode)  # seen by the caller: another procfs


def test_a_program_cannot_pass_its_failure_off_as_the_sandbox_not_starting(mode):
    program = "import os, sys\nsys.stderr.write('bwrap: Can\\'t mount proc\\n')\nsys.stderr.flush()\nos._exit(1)\n"
    result = run(mode, Check(program, "assert f(1) == 2\n", ("f",)))
    assert result.status == "failed" and "could not start" not in result.reason, result.reason


def test_a_sandbox_that_does_not_start_is_an_error_known_from_the_callers_side(mode, monkeypatch):
    from mdmkit.sandbox import isolation

    argv = isolation.bwrap_argv
    monkeypatch.setattr(channel, "bwrap_argv", lambda *a, **k: argv(*a, **k) + ["/nonexistent/python"])
    monkeypatch.setattr(channel, "interpreter", lambda: ("/nonexistent/python", "/nonexistent"))
    result = run(mode, Check("def f(x):\n    return 2\n", "assert f(1) == 2\n", ("f",)))
    assert result.status == "error" and result.reason.startswith("could not start the sandbox"), result.reason


# --- survivors ------------------------------------------------------------------------------------------------

def test_survivors_of_the_kill_are_reported_and_stop_further_programs(mode, monkeypatch):
    survivor = subprocess.Popen(["sleep", "60"])  # stands for a process that SIGKILL could not end
    try:
        with monkeypatch.context() as patched:
            patched.setattr(channel.procs, "kill_until_gone", lambda find, patience_s=5.0: [survivor.pid])
            result = run(mode, "pass\n")
            assert result.status == "killed" and f"processes [{survivor.pid}] survived SIGKILL" in result.reason
            with pytest.raises(channel.LeftoverProcesses, match=str(survivor.pid)):
                run(mode, "pass\n")
            [refused] = run_many(["pass\n"], limits(mode), progress=False)
            assert refused.status == "error" and "LeftoverProcesses" in refused.reason
    finally:
        survivor.kill()
        survivor.wait()
    assert run(mode, "pass\n").passed and channel._leaked == []  # gone: programs run again


# --- thread and fork bombs under root -------------------------------------------------------------------------

def test_a_thread_bomb_is_stopped_near_the_task_limit(mode):
    program = (  # says how far it got every 8 threads: root's bombs reached 487-592 tasks before the watchdog
        "import threading, time\nthreading.stack_size(256 * 1024)\nstarted = 0\n"
        "try:\n    for _ in range(600):\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        started += 1\n        if started % 8 == 0:\n            print(started, flush=True)\n"
        "except RuntimeError:\n    pass\ntime.sleep(5)\n"
    )
    result = run(mode, program, max_processes=32)
    assert result.status in ("killed", "timeout") and result.stdout, result
    assert max(map(int, result.stdout.split())) <= 32 + 2, result.stdout  # pids.max or RLIMIT_NPROC


def test_no_program_mounts_anything(mode):
    program = (  # a tmpfs in the working directory outlived the fallback's run as root, unbounded
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "os.mkdir('mnt')\n"
        "print('mount', libc.mount(b'none', b'mnt', b'tmpfs', 0, None), ctypes.get_errno())\n"
    )
    result = run(mode, program)
    assert result.passed, result.reason
    if contained(mode) or not ROOT_USER:
        assert "mount -1 1" in result.stdout, result.stdout  # EPERM: no capability left to mount with


# --- the process fallback's namespaces ------------------------------------------------------------------------

def test_fallback_programs_cannot_reach_their_siblings_or_the_caller():
    writer = "import time\nopen('scratch.txt', 'w').write('sibling secret')\ntime.sleep(2)\n"
    reader = (
        "import glob, os, time\ntime.sleep(0.5)\nfound = []\n"
        "for path in glob.glob('/tmp/mdmkit-sandbox-*/scratch.txt'):\n"
        "    try:\n        found.append(open(path).read())\n    except OSError:\n        pass\n"
        "print('found', found)\n"
        "try:\n    os.kill(-1, 0)\n    print('kill(-1) reached something')\n"
        "except OSError as e:\n    print('kill(-1) refused', e.errno)\n"
    )
    results = run_many([writer, reader], limits("process", timeout_s=10.0), workers=2, progress=False)
    assert all(r.passed for r in results), [r.reason for r in results]
    if FALLBACK_NS:
        assert "found []" in results[1].stdout and "kill(-1) refused 3" in results[1].stdout
        assert {"ipcns", "mntns"} <= set(results[0].protections)
    else:  # NOT contained without namespaces (docs/sandbox.md)
        assert "sibling secret" in results[1].stdout

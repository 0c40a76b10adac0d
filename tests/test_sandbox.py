"""The code-execution sandbox: correct results, opt-in gate, and containment of hostile programs."""

from __future__ import annotations

import os
import resource
import socket
import tempfile

import pytest

from mdmkit.core.errors import ConfigError
from mdmkit.sandbox import (
    ENV_VAR,
    SandboxLimits,
    UnsafeExecutionError,
    run_many,
    run_program,
)

FAST = SandboxLimits(timeout_s=2.0, memory_mb=512, max_output_bytes=10_000)


@pytest.fixture(autouse=True)
def _allow(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")


def _alive_in_session(sid: int) -> list[int]:
    """Non-zombie processes whose session id is `sid` (read independently of the module's own sweep)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, _ppid, _pgrp, session = stat[stat.rfind(b")") + 2:].split()[:4]
        if int(session) == sid and state not in (b"Z", b"X"):
            alive.append(int(entry))
    return alive


def _protections() -> tuple[str, ...]:
    return run_program("pass\n", FAST).protections


# --- gate and limits ------------------------------------------------------------------------------------------

def test_gate_refuses_without_opt_in(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
        run_program("print(1)\n")
    with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
        run_many(["print(1)\n"], progress=False)
    monkeypatch.setenv(ENV_VAR, "yes")  # only the exact value "1" opts in
    with pytest.raises(UnsafeExecutionError):
        run_program("print(1)\n")
    assert run_program("print(1)\n", FAST, allow=True).passed


def test_limits_are_validated():
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ConfigError, match="memory_mb"):
        SandboxLimits(memory_mb=-1)
    with pytest.raises(ConfigError, match="max_output_bytes"):
        SandboxLimits(max_output_bytes=0)


# --- ordinary programs ----------------------------------------------------------------------------------------

def test_correct_program_passes():
    result = run_program("def f(x):\n    return 2 * x\nprint(f(21))\nassert f(2) == 4\n", FAST)
    assert result.passed and result.status == "passed" and result.returncode == 0
    assert result.stdout == "42\n" and not result.truncated


def test_assertion_failure_fails():
    result = run_program("assert 1 + 1 == 3, 'arithmetic'\n", FAST)
    assert not result.passed and result.status == "failed"
    assert "AssertionError: arithmetic" in result.stderr


def test_syntax_error_is_an_error_with_stderr():
    result = run_program("def f(:\n    pass\n", FAST)
    assert not result.passed and result.status == "error"
    assert "SyntaxError" in result.stderr


def test_environment_is_minimal_and_stdin_closed(monkeypatch):
    monkeypatch.setenv("MDMKIT_SECRET_TOKEN", "leak")
    program = (
        "import os, sys\n"
        "assert 'MDMKIT_SECRET_TOKEN' not in os.environ, os.environ\n"
        "assert os.environ['HOME'] == os.getcwd()\n"
        "assert os.environ['OMP_NUM_THREADS'] == '1'\n"
        "assert sys.stdin.read() == ''\n"
        "assert sys.flags.isolated\n"
    )
    assert run_program(program, FAST).passed


# --- early exits cannot fake a pass ---------------------------------------------------------------------------

@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"])
def test_exit_zero_before_the_asserts_does_not_pass(exit_call):
    result = run_program(f"def f():\n    return 1\n{exit_call}\nassert f() == 2\n", FAST)
    assert result.returncode == 0  # the exit status alone would say "passed"
    assert not result.passed and result.status == "failed" and "before reaching its end" in result.reason


# --- hostile programs in one batch: each contained, the good ones still pass ---------------------------------

GOOD = "assert sum(range(10)) == 45\nprint('ok')\n"
HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "memory_bomb": "x = bytearray(10 * 1024 ** 3)\n",
    "memory_bomb_str": "x = 'a' * (10 ** 10)\n",
    "output_flood": "while True:\n    print('x' * 10 ** 6)\n",
    "stderr_flood": "import sys\nwhile True:\n    sys.stderr.write('y' * 10 ** 6)\n",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 9))\n",
    "raw_socket": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)\n",
}


def test_hostile_batch_is_contained_and_good_programs_still_pass():
    names = ["good_first", *HOSTILE, "good_last"]
    sources = [GOOD, *HOSTILE.values(), GOOD]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = run_many(sources, FAST, workers=2, progress=False)
    by_name = dict(zip(names, results))

    assert by_name["good_first"].passed and by_name["good_last"].passed
    assert by_name["good_first"].stdout == "ok\n"  # results come back in input order
    for name in HOSTILE:
        assert not by_name[name].passed, name

    loop = by_name["infinite_loop"]
    assert loop.status == "timeout" and loop.duration_s < FAST.timeout_s + 2

    bomb = by_name["fork_bomb"]  # the process-count watchdog kills it long before the timeout
    assert bomb.status == "killed" and "processes" in bomb.reason and bomb.duration_s < 1.5

    for name in ("memory_bomb", "memory_bomb_str"):  # RLIMIT_AS: a MemoryError in the child, not in this machine
        assert by_name[name].status in ("failed", "killed"), by_name[name]
        assert by_name[name].status == "killed" or "MemoryError" in by_name[name].stderr

    for name, stream in (("output_flood", "stdout"), ("stderr_flood", "stderr")):
        flood = by_name[name]
        assert flood.truncated and flood.status == "killed" and "output" in flood.reason
        assert len(getattr(flood, stream).encode()) <= FAST.max_output_bytes
    # gigabytes were offered; the caller's peak memory grew by far less than that
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 1024  # KiB

    for name in ("socket", "raw_socket"):
        assert "PermissionError: network access is disabled" in by_name[name].stderr

    for name, result in by_name.items():  # nothing of any run survives it, fork bomb included
        assert result.session_id is not None
        assert _alive_in_session(result.session_id) == [], name


def test_background_children_are_killed_when_the_program_ends():
    program = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid)\n"
    )
    result = run_program(program, FAST)
    assert result.passed  # finishing while a child still runs is allowed ...
    assert _alive_in_session(result.session_id) == []  # ... but the child does not outlive the run


def test_killing_the_parent_hits_a_throwaway_intermediate_not_the_caller():
    program = (
        "import os, signal\n"
        "print(os.getppid(), flush=True)\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "import time; time.sleep(5)\n"
    )
    result = run_program(program, FAST)
    # we are still running; the program's parent was the sandbox's intermediate (or, in a pid namespace, pid 0:
    # kill(0) then hits only the sandbox's own process group)
    assert int(result.stdout.split()[0]) != os.getpid()
    assert not result.passed and result.status == "killed"
    assert _alive_in_session(result.session_id) == []


def test_caller_pid_is_unaddressable_from_a_pid_namespace():
    if "pidns" not in _protections():
        pytest.skip("no pid namespace here (unshare failed): only the intermediate process protects the caller")
    # The program finds this test process's real pid through /proc and probes it with signal 0 (harmless
    # even if the protection were missing): from inside the pid namespace that pid does not exist.
    program = (
        "import os\n"
        "def ppid(pid):\n"
        "    stat = open(f'/proc/{pid}/stat', 'rb').read()\n"
        "    return int(stat[stat.rfind(b')') + 2:].split()[1])\n"
        "me = int(os.readlink('/proc/self'))\n"
        "caller = ppid(ppid(me))\n"
        "print(caller)\n"
        "try:\n"
        "    os.kill(caller, 0)\n"
        "    print('reachable')\n"
        "except ProcessLookupError:\n"
        "    print('unreachable')\n"
    )
    result = run_program(program, FAST)
    assert result.passed, result.stderr
    caller, verdict = result.stdout.split()
    assert int(caller) == os.getpid() and verdict == "unreachable"


def test_network_namespace_blocks_even_a_raw_socket():
    if "netns" not in _protections():
        pytest.skip("no network namespace here: only the Python-level socket guard is active")
    with socket.create_server(("127.0.0.1", 0)) as server:  # listening on the caller's loopback
        port = server.getsockname()[1]
        program = (  # `_socket` bypasses the Python-level guard; the namespace still has no route to us
            "import _socket\n"
            "s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
            "s.settimeout(1)\n"
            f"s.connect(('127.0.0.1', {port}))\n"
            "print('connected')\n"
        )
        result = run_program(program, FAST)
    assert not result.passed and "connected" not in result.stdout
    assert "Error" in result.stderr


def test_files_cwd_is_a_fresh_temp_dir_that_is_removed(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    outside = tmp_path / "outside.txt"
    program = (
        "import os\n"
        "print(os.getcwd())\n"
        "open('inside.txt', 'w').write('scratch')\n"
        "for name in os.listdir('.'):\n"  # delete everything in the working directory
        "    os.remove(name)\n"
        f"open({str(outside)!r}, 'w').write('escaped')\n"
    )
    result = run_program(program, FAST)
    cwd = result.stdout.strip()
    assert os.path.basename(cwd).startswith("mdmkit-sandbox-")
    assert os.path.dirname(cwd) == tempfile.gettempdir() and cwd != os.getcwd()
    assert not os.path.exists(cwd)  # removed afterwards
    assert keep.read_text() == "precious"  # deleting "everything" only deleted the sandbox's own files
    if os.geteuid() == 0:
        # NOT contained (documented): the file system is shared and root ignores permissions, so an absolute
        # path outside the temp dir is writable. The sandbox is not a security boundary.
        assert outside.read_text() == "escaped"

"""The code sandbox: results, the opt-in gate, isolation modes, unforgeable verdicts, and hostile programs.

Every attack runs under bwrap and under the process fallback and asserts the exact outcome in each; where the
fallback does not contain an attack, the test says so and asserts that it indeed escapes (docs/sandbox.md has
the same table). Every attack is bounded (a few hundred MB, a few hundred tasks, seconds) so that a regression
cannot harm the machine running the tests, and probes the caller only with harmless operations (signal 0,
opening /proc/<pid>/mem read-only, connecting to a listener the test owns).
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_support import (
    FALLBACK_NS,
    ROOT,
    ROOT_USER,
    SECCOMP,
    contained,
    leftovers,
    limits,
    run,
    sleeper,
    user_wide_nproc,
)

from mdmkit.core.errors import ConfigError
from mdmkit.sandbox import (
    ENV_VAR,
    Check,
    SandboxLimits,
    UnsafeExecutionError,
    codec,
    describe_isolation,
    isolation,
    run_many,
    run_program,
)

pytestmark = pytest.mark.usefixtures("allow_code_execution")


# --- gate, settings, modes ------------------------------------------------------------------------------------

def test_gate_refuses_without_opt_in(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
        run_program("print(1)\n")
    with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
        run_many(["print(1)\n"], progress=False)
    monkeypatch.setenv(ENV_VAR, "yes")  # only the exact value "1" opts in
    with pytest.raises(UnsafeExecutionError):
        run_program("print(1)\n")
    assert run_program("print(1)\n", limits("process"), allow=True).passed


def test_limits_are_validated(monkeypatch):
    for bad, name in (({"timeout_s": 0}, "timeout_s"), ({"memory_mb": -1}, "memory_mb"),
                      ({"max_output_bytes": 0}, "max_output_bytes"), ({"isolation": "docker"}, "isolation")):
        with pytest.raises(ConfigError, match=name):
            SandboxLimits(**bad)
    monkeypatch.setenv("MDMKIT_SANDBOX_ISOLATION", "process")
    assert SandboxLimits().isolation == "process"


def test_auto_falls_back_with_one_notice_and_refuses_where_it_must(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "bwrap_status", lambda: (False, "bwrap is not installed"))
    monkeypatch.setattr(isolation, "_warned", isolation.threading.Event())
    monkeypatch.setattr(isolation, "gpu_node", lambda: False)
    backends = [isolation.resolve("auto") for _ in range(3)]
    notice = capsys.readouterr().err.splitlines()
    assert backends == [isolation.PROCESS] * 3 and len(notice) == 1  # one line, however many programs
    assert notice[0].startswith("mdmkit sandbox: bwrap is not installed; generated code runs in the weaker process "
                                "sandbox, which does NOT contain: file-system reads")
    assert notice[0].endswith(f"{isolation.not_contained()} (docs/sandbox.md)")
    with pytest.raises(UnsafeExecutionError, match="isolation=bwrap, but bwrap is not installed"):
        isolation.resolve("bwrap")
    monkeypatch.setattr(isolation, "gpu_node", lambda: True)  # shared GPU nodes: no silent fallback
    with pytest.raises(UnsafeExecutionError, match="GPU node.*MDMKIT_SANDBOX_ISOLATION=process"):
        run_many(["pass\n"], limits("auto"), progress=False)
    assert "refused" in describe_isolation("auto")
    assert isolation.resolve("process") is isolation.PROCESS  # asked for explicitly: allowed


def test_mode_is_reported(mode):
    result = run(mode, "pass\n")
    assert result.passed and result.isolation == mode
    assert ("bwrap" in result.protections) == (mode == "bwrap")
    assert mode in describe_isolation(mode)


def test_cgroup_discovery_and_limits_on_a_stand_in_directory(tmp_path, monkeypatch):
    """The cgroup v2 and v1 paths, on plain files (no program runs in them): what is found, written and read."""
    from mdmkit.sandbox import cgroups

    monkeypatch.setenv(cgroups.CGROUP_ENV, str(tmp_path))
    cgroups.parent.cache_clear()
    try:
        (tmp_path / "cgroup.subtree_control").write_text("cpu pids\n")
        found, why = cgroups.parent()
        assert found is None and why == f"{tmp_path} does not delegate the memory and pids controllers to " \
            "sub-cgroups"
        cgroups.parent.cache_clear()
        (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
        assert cgroups.parent() == (cgroups.Place(tmp_path), "")
    finally:
        cgroups.parent.cache_clear()
    group = cgroups.Cgroup(cgroups.Place(tmp_path), memory_mb=256, max_tasks=32)
    assert (group.path / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (group.path / "pids.max").read_text() == "32"
    (group.path / "cgroup.procs").write_text("")
    echoed = subprocess.run(group.wrap(["/bin/echo", "inside"]), capture_output=True, text=True, check=True)
    assert echoed.stdout == "inside\n" and (group.path / "cgroup.procs").read_text().split() == ["0"]
    assert group.pids() == []  # "0" (the writer itself) is never a pid to kill
    assert group.breach() == ""
    (group.path / "pids.events").write_text("max 3\n")
    assert group.breach() == "tasks"
    (group.path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    assert group.breach() == "memory"

    memory, pids = tmp_path / "v1-memory", tmp_path / "v1-pids"
    memory.mkdir()
    pids.mkdir()
    v1 = cgroups.Cgroup(cgroups.Place(memory, pids), memory_mb=256, max_tasks=32)
    assert (v1.dirs[0] / "memory.limit_in_bytes").read_text() == str(256 * 1024 * 1024)
    assert (v1.dirs[1] / "pids.max").read_text() == "32"
    echoed = subprocess.run(v1.wrap(["/bin/echo", "both"]), capture_output=True, text=True, check=True)
    assert echoed.stdout == "both\n"
    assert [(d / "cgroup.procs").read_text().split() for d in v1.dirs] == [["0"], ["0"]]  # joined both
    (v1.dirs[0] / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert v1.breach() == ""
    (v1.dirs[0] / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert v1.breach() == "memory"


# --- results and verdicts -------------------------------------------------------------------------------------

def test_script_results(mode):
    ok = run(mode, "def f(x):\n    return 2 * x\nprint(f(21))\nassert f(2) == 4\n")
    assert ok.passed and ok.status == "passed" and ok.stdout == "42\n" and not ok.truncated
    failed = run(mode, "assert 1 + 1 == 3, 'arithmetic'\n")
    assert failed.status == "failed" and "AssertionError: arithmetic" in failed.reason
    assert "AssertionError: arithmetic" in failed.stderr
    syntax = run(mode, "def f(:\n    pass\n")
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr and "does not compile" in syntax.reason


def test_checks_run_in_the_caller_against_the_candidate(mode):
    tests = "assert double(2) == 4\nassert double(x=5) == 10\nassert sorted(pairs(3)) == [(0, 0), (1, 2), (2, 4)]\n"
    good = Check("def double(x):\n    return 2 * x\ndef pairs(n):\n    return {(i, double(i)) for i in range(n)}\n",
                 tests, remote=("double", "pairs"))
    assert run(mode, good).passed
    wrong = Check("def double(x):\n    return x + 2\ndef pairs(n):\n    return set()\n", tests, ("double", "pairs"))
    result = run(mode, wrong)
    assert result.status == "failed" and result.reason.startswith("AssertionError at line 2 of the checks")
    missing = run(mode, Check("def other(x):\n    return x\n", tests, ("double",)))
    assert missing.status == "failed" and "NameError" in missing.reason


def test_candidate_exceptions_objects_and_setup(mode):
    tests = ("assert longest([Pair(1, 2), Pair(5, 9)]) == 4\nassert size(root) == 2\n"
             "assert keep((1, 'a', 2.5), int) == [1]\n")
    solution = ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n"
                "class Node:\n    def __init__(self, child=None):\n        self.child = child\n"
                "def size(node):\n    return 0 if node is None else 1 + size(node.child)\n"
                "def keep(values, kind):\n    return [v for v in values if isinstance(v, kind)]\n")
    check = Check(solution, tests, ("Pair", "keep", "longest", "root", "size"), setup="root = Node(Node())\n")
    assert run(mode, check).passed  # objects come back as handles, `int` as a built-in type, `root` by name
    raising = Check("def f(x):\n    raise ValueError('no ' + str(x))\n", "assert f(3) == 1\n", ("f",))
    result = run(mode, raising)
    assert result.status == "failed" and result.reason.startswith("the candidate raised ValueError: no 3 at line 1")


FORGERIES = {
    # An object equal to everything: it never reaches the checks, which see an opaque stand-in.
    "eq_always_true": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                      "def f(x):\n    return Yes()\n",
    "int_subclass_eq": "class Liar(int):\n    def __eq__(self, other):\n        return True\n"
                       "    __hash__ = int.__hash__\ndef f(x):\n    return Liar(0)\n",
    # Walk the server's frames for anything token-like and print it, then write forged replies to every fd.
    "stack_frames_and_forged_frames": (
        "import sys, os, json, struct\n"
        "frame = sys._getframe()\n"
        "while frame:\n    print(sorted(map(str, frame.f_locals.values()))[:20])\n    frame = frame.f_back\n"
        "for body in ({'ok': 'loaded'}, {'ok': True}, {'passed': True}, {'ok': 'PASS'}):\n"
        "    data = json.dumps(body).encode()\n"
        "    for fd in range(3, 12):\n"
        "        try:\n            os.write(fd, struct.pack('>I', len(data)) + data)\n"
        "        except OSError:\n            pass\n"
        "def f(x):\n    return 0\n"),
    # Patched exits and exceptions only change the candidate's own interpreter.
    "patched_exits": "import os, sys, builtins\nos._exit = lambda *a: None\nsys.exit = lambda *a: None\n"
                     "builtins.AssertionError = type('Never', (Exception,), {})\ndef f(x):\n    return 0\n",
    "exit_zero_in_call": "import os\ndef f(x):\n    os._exit(0)\n",
    "system_exit_in_call": "def f(x):\n    raise SystemExit(0)\n",
    "exit_zero_at_load": "import sys\nsys.exit(0)\ndef f(x):\n    return 2\n",
    "huge_reply": "def f(x):\n    return 'x' * 2_000_000\n",
}


@pytest.mark.parametrize("name", FORGERIES)
def test_verdicts_cannot_be_forged(mode, name):
    result = run(mode, Check(FORGERIES[name], "assert f(1) == 2\n", ("f",)))
    assert result.status == "failed" and not result.passed, (name, result.reason)


def test_plain_data_decoder_admits_only_built_in_types():
    value = {"a": [1, 2.5, None, True], (1, "x"): {frozenset({3}), b"\x00"}, "c": complex(1, 2), "r": range(3)}
    assert codec.from_wire(codec.unpack(codec.pack(codec.to_wire(value))[4:])) == value
    for junk in ({"t": "evil", "v": 1}, {"t": "dict", "v": [[[1], 2]]}, {"t": "tuple", "v": 1, "x": 2},
                 {"t": "ref", "v": "os"}, {"t": "builtin", "v": "exec"}, {"t": "set", "v": [[1]]}):
        with pytest.raises(codec.WireError):
            codec.from_wire(junk)
    nested = [[]]
    for _ in range(100):
        nested = [nested]
    with pytest.raises(codec.WireError, match="deeper"):
        codec.from_wire(nested)
    opaque = codec.from_wire(codec.to_wire(object()))
    assert isinstance(opaque, codec.Opaque) and opaque != opaque.__class__("object", "")  # equal only to itself


def test_decoding_costs_the_trusted_side_linear_time_and_bounded_memory():
    """What the caller builds from a reply, after the deadline, outside the sandbox's memory limit: a range only
    if expanding it (a check's `tuple(...)` of it) fits the reply's budget (tests/test_sandbox_decoding.py), and
    keys of one hash (quadratic to insert) are refused."""
    assert codec.from_wire(codec.to_wire(range(10, -5, -3))) == range(10, -5, -3)
    assert codec.from_wire(codec.to_wire(range(5, 0))) == range(0)
    assert codec.from_wire(codec.to_wire(range(codec.MAX_ITEMS))) == range(codec.MAX_ITEMS)
    for huge in (range(2**21), range(0, 5 * 2**21, 5), range(0, -10**30, -1)):  # 2**21 ints: 72 MB
        with pytest.raises(codec.WireError, match="beyond its budget of 64 MB"):
            codec.from_wire(codec.to_wire(huge))
    colliding = [k * (2**61 - 1) for k in range(1, codec.MAX_SHARED_HASHES + 3)]  # ints hash modulo 2**61 - 1
    for tag, wire in (("set", colliding), ("frozenset", colliding), ("keys", colliding),
                      ("dict", [[k, 0] for k in colliding]), ("Counter", [[k, 1] for k in colliding])):
        with pytest.raises(codec.WireError, match="share one hash"):
            codec.from_wire({"t": tag, "v": wire})
    few = colliding[: codec.MAX_SHARED_HASHES]
    assert codec.from_wire(codec.to_wire(set(few))) == set(few)
    assert codec.from_wire(codec.to_wire({k: 1 for k in few})) == {k: 1 for k in few}
    grid = {(i, j) for i in range(-40, 41) for j in range(-40, 41)}  # hash(-1) == hash(-2): many pairs, honest
    assert codec.from_wire(codec.to_wire(grid)) == grid
    assert codec.from_wire(codec.to_wire(dict.fromkeys(grid, 0))) == dict.fromkeys(grid, 0)


# --- ordinary limits ------------------------------------------------------------------------------------------

GOOD = "assert sum(range(10)) == 45\nprint('ok')\n"
HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os, time\nfor _ in range(300):\n    if os.fork() == 0:\n        time.sleep(5)\n"
                 "        os._exit(0)\ntime.sleep(5)\n",
    "memory_bomb": "x = bytearray(10 * 1024 ** 3)\n",
    "output_flood": "while True:\n    print('x' * 10 ** 6)\n",
    "stderr_flood": "import sys\nwhile True:\n    sys.stderr.write('y' * 10 ** 6)\n",
}


def test_hostile_batch_is_contained_and_good_programs_still_pass(mode):
    names = ["good_first", *HOSTILE, "good_last"]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = dict(zip(names, run_many([GOOD, *HOSTILE.values(), GOOD], limits(mode), workers=2, progress=False)))
    assert results["good_first"].passed and results["good_last"].stdout == "ok\n"  # input order kept
    loop = results["infinite_loop"]
    assert loop.status == "timeout"  # ended by its deadline
    bomb = results["fork_bomb"]  # cgroup pids.max or the watchdog: long before the timeout
    if user_wide_nproc(mode):
        assert bomb.status == "failed" and "BlockingIOError" in bomb.reason, bomb.reason
    else:
        assert bomb.status == "killed" and "tasks" in bomb.reason, bomb.reason  # the task limit, not the timeout
    memory = results["memory_bomb"]  # RLIMIT_AS: a MemoryError inside, nothing on this machine
    assert memory.status == "failed" and "MemoryError" in memory.reason
    for name, stream in (("output_flood", "stdout"), ("stderr_flood", "stderr")):
        flood = results[name]
        assert flood.truncated and flood.status == "killed" and "output" in flood.reason
        assert len(getattr(flood, stream).encode()) <= 10_000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 1024  # KiB: caller bounded


# --- attacks: file system -------------------------------------------------------------------------------------

@pytest.fixture
def outside_tmp():
    """A directory of the caller's outside /tmp (in /var/tmp, which any user may write), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="mdmkit-sandbox-probe-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def test_file_system_outside_the_temp_dir(mode, tmp_path, monkeypatch, outside_tmp):
    caller_cwd = tmp_path / "caller"  # stands for the caller's working directory (e.g. the checkout)
    caller_cwd.mkdir()
    monkeypatch.chdir(caller_cwd)
    secret = tmp_path / "secret.txt"
    secret.write_text("sk-secret")
    in_tmp, elsewhere = [tmp_path / "escaped.txt", caller_cwd / "results.jsonl"], outside_tmp / "escaped.txt"
    program = (
        "import os, sys\n"
        f"for path in {[str(t) for t in [*in_tmp, elsewhere]]!r} + ['/usr/escaped.txt']:\n"
        "    try:\n        open(path, 'w').write('escaped')\n        print('wrote', path)\n"
        "    except OSError as e:\n        print('denied', path, e.errno)\n"
        f"for path in [{str(secret)!r}, {str(ROOT / 'pyproject.toml')!r}, os.path.expanduser('~root/.bashrc')]:\n"
        "    try:\n        print('read', path, open(path).read()[:9])\n"
        "    except OSError as e:\n        print('unreadable', path, e.errno)\n"
        f"print('checkout visible', os.path.exists({str(ROOT)!r}))\n"
        f"try:\n    print('home', sorted(os.listdir({str(Path.home())!r})))\nexcept OSError as e:\n"
        "    print('home', [])\n"
        "open('scratch.txt', 'w').write('inside')\n"  # the private temp dir is writable
        "print('sys.path', [p for p in sys.path if 'site-packages' in p])\n"
    )
    result = run(mode, program)
    assert result.passed, result.reason
    out = result.stdout
    if mode == "bwrap":
        assert not any(t.exists() for t in [*in_tmp, elsewhere]) and out.count("denied") == 4
        assert "wrote" not in out and "read" not in out.replace("unreadable", "")
        assert "checkout visible False" in out and "sys.path []" in out  # the interpreter alone: no venv
        prefix = Path(isolation.interpreter()[1])  # the home directory shows no more than the path to it
        shown = [prefix.relative_to(Path.home()).parts[0]] if prefix.is_relative_to(Path.home()) else []
        assert f"home {shown}" in out
        return
    checkout_in_tmp = FALLBACK_NS and ROOT.resolve().is_relative_to("/tmp")  # a clone in /tmp is out of sight
    assert f"checkout visible {not checkout_in_tmp}" in out  # NOT contained: the fallback reads what it may
    if FALLBACK_NS:  # every mount read-only, /tmp a private tmpfs: the caller's files there are out of sight
        assert not elsewhere.exists() and f"denied {elsewhere}" in out and "wrote" not in out.split("sys.path")[0]
        assert not any(t.exists() for t in in_tmp) and f"unreadable {secret} 2" in out
    else:  # NOT contained (docs/sandbox.md): outside /tmp, the caller's file system is the program's
        assert elsewhere.read_text() == "escaped"
        assert all(t.read_text() == "escaped" for t in in_tmp) and f"read {secret} sk-secret" in out


def test_tmp_and_dev_shm_are_private_and_bounded(mode, marker):
    shm = Path("/dev/shm") / marker
    program = (
        f"open({str(shm)!r}, 'wb').write(b'x' * 1024 * 1024)\n"
        "import os\ntry:\n    open('big', 'wb').write(b'x' * 20 * 1024 * 1024)\nexcept OSError as e:\n"
        "    print('big', e.errno)\n    os.remove('big')\n"
        "for name in ('a', 'b', 'c', 'd'):\n"  # each file under max_file_mb, all of them over disk_mb
        "    try:\n        open(name, 'wb').write(b'x' * 10 * 1024 * 1024)\n        print('wrote', name)\n"
        "    except OSError as e:\n        print('refused', name, e.errno)\n"
    )
    try:
        result = run(mode, program, disk_mb=24, max_file_mb=16)
        assert result.passed and "big 27" in result.stdout  # EFBIG: RLIMIT_FSIZE in both modes
        if contained(mode):
            assert not shm.exists()  # nothing of /dev/shm or /tmp survives the run
            assert "wrote a" in result.stdout and "refused c 28" in result.stdout  # ENOSPC: bounded tmpfs
        else:  # NOT contained: /dev/shm is the machine's, and the temp dir is bounded per file only
            assert shm.exists() and "wrote d" in result.stdout
    finally:
        shm.unlink(missing_ok=True)


# --- attacks: the caller itself -------------------------------------------------------------------------------

def _ptrace_open() -> bool:
    """Whether a same-user process may open another's /proc/<pid>/mem (Yama scope 0 or no Yama)."""
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    return ROOT_USER or not scope.exists() or scope.read_text().strip() == "0"


def test_caller_environment_and_memory(mode, monkeypatch):
    monkeypatch.setenv("MDMKIT_FAKE_API_TOKEN", "sk-fake")  # the sandbox's own environment never has it
    caller = os.getpid()
    program = (
        "import os\n"
        "print('token in env', 'MDMKIT_FAKE_API_TOKEN' in os.environ, sorted(os.environ))\n"
        f"try:\n    print('environ', b'PATH=' in open('/proc/{caller}/environ', 'rb').read())\n"
        "except OSError as e:\n    print('environ unreadable', e.errno)\n"
        f"try:\n    open('/proc/{caller}/mem', 'rb').close()\n    print('mem opened')\n"  # read-only: harmless
        "except OSError as e:\n    print('mem refused', e.errno)\n"
    )
    result = run(mode, program)
    assert result.passed and "token in env False" in result.stdout
    if contained(mode):  # the caller is not in the sandbox's pid namespace or /proc
        assert "environ unreadable 2" in result.stdout and "mem refused 2" in result.stdout
    else:  # NOT contained: same uid (or root) and the host's /proc
        assert "environ True" in result.stdout
        assert ("mem opened" in result.stdout) == _ptrace_open()


CONNECT = (  # a program's attempt on the caller's loopback listener at {port}
    "try:\n    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
    "except OSError as e:\n    print('no socket', e.errno)\n"
    "else:\n    s.settimeout(1)\n"
    "    try:\n        s.connect(('127.0.0.1', {port}))\n        print('connected')\n"
    "    except OSError as e:\n        print('no route', e.errno)\n"
)


def _listener():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    return server, server.getsockname()[1]


def test_setns_into_the_callers_network_namespace(mode):
    server, port = _listener()
    program = (
        "import ctypes, os, _socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"try:\n    fd = os.open('/proc/{os.getpid()}/ns/net', os.O_RDONLY)\n"
        "    print('setns', libc.setns(fd, 0x40000000), ctypes.get_errno())\n"
        "except OSError as e:\n    print('no namespace file', e.errno)\n"
        + CONNECT.format(port=port)
    )
    with server:
        result = run(mode, program)
    assert result.passed, result.reason
    if contained(mode):  # the caller's /proc entry does not exist in the sandbox
        assert "no namespace file 2" in result.stdout
    elif ROOT_USER:  # NOT contained: root may enter the caller's namespace
        assert "setns 0 0" in result.stdout
    else:  # refused (EPERM) without CAP_SYS_ADMIN
        assert "setns -1 1" in result.stdout
    if SECCOMP:  # no socket at all, whichever namespace it is in
        assert "no socket 1" in result.stdout, result.stdout
    else:
        assert ("no route" in result.stdout) == contained(mode) and ("connected" in result.stdout) != contained(mode)


def test_sockets_and_signals_to_the_caller_and_other_processes(mode):
    server, port = _listener()
    helper = subprocess.Popen(["sleep", "30"])  # an unrelated process of the same user
    program = (
        "import os, signal, _socket\n"
        + CONNECT.format(port=port) +
        f"for name, pid, sig in (('caller', {os.getpid()}, 0), ('helper', {helper.pid}, signal.SIGTERM)):\n"
        "    try:\n        os.kill(pid, sig)\n        print(name, 'reached')\n"
        "    except OSError as e:\n        print(name, 'unreachable', e.errno)\n"
    )
    try:
        with server:
            result = run(mode, program)
        held = contained(mode)
        assert result.passed, result.reason
        if SECCOMP:  # sockets refused in every mode: the caller's loopback is out of reach
            assert "no socket 1" in result.stdout and "connected" not in result.stdout, result.stdout
        else:
            assert ("no route" in result.stdout) == held and ("connected" in result.stdout) != held
        assert ("caller unreachable 3" in result.stdout) == held  # ESRCH: not even addressable
        time.sleep(0.1)
        assert (helper.poll() is None) == held  # SIGTERM never arrived where contained
    finally:
        helper.kill()
        helper.wait()


# --- attacks: resources and processes -------------------------------------------------------------------------

def test_thread_bomb(mode):
    program = (
        "import threading, time\nthreading.stack_size(256 * 1024)\nstarted = 0\n"
        "try:\n    for _ in range(600):\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        started += 1\nexcept RuntimeError:\n    pass\nprint(started, flush=True)\ntime.sleep(5)\n"
    )
    result = run(mode, program)
    if user_wide_nproc(mode):  # threads stop at the rlimit; the program then sleeps into its timeout
        assert result.status == "timeout", result.reason
    else:
        assert result.status == "killed" and "tasks" in result.reason, result.reason


def test_setsid_and_wide_forking(mode, marker):
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    for _ in range(200):\n        if os.fork() == 0:\n"
        f"            {sleeper(marker)}\n        time.sleep(0.001)\n    time.sleep(30)\n"
        "time.sleep(30)\n"
    )
    result = run(mode, program)
    if user_wide_nproc(mode):
        assert result.status == "failed" and "BlockingIOError" in result.reason, result.reason
    else:
        assert result.status == "killed" and "tasks" in result.reason, result.reason
    assert leftovers(marker) == []


def test_memory_of_many_processes_is_bounded_in_sum(mode):
    program = (  # 4 x 120 MB against a 256 MB limit; each alone stays under its RLIMIT_AS
        "import os, time\n"
        "for _ in range(3):\n    if os.fork() == 0:\n        break\n"
        "block = bytearray(120 * 1024 * 1024)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\n"
        "time.sleep(10)\n"
    )
    result = run(mode, program, timeout_s=5.0, max_processes=4096)  # memory is the limit under test here
    assert result.status == "killed" and "memory" in result.reason, result.reason  # not the timeout


def test_a_setsid_child_holding_the_pipes_does_not_block_the_caller(mode, marker):
    program = (
        "import os\n"
        f"if os.fork() == 0:\n    os.setsid()\n    {sleeper(marker, 60)}\n"
        "while True:\n    pass\n"
    )
    start = time.monotonic()
    result = run(mode, program, timeout_s=1.0, max_processes=4096)  # (a user-wide RLIMIT_NPROC must not bite)
    assert result.status == "timeout" and time.monotonic() - start < 1.0 + 1.0
    assert leftovers(marker) == []


def test_detached_children_do_not_outlive_the_run(mode, marker):
    program = (  # double fork + setsid: the classic daemon, re-parented away from the program
        "import os\n"
        f"if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        {sleeper(marker, 60)}\n"
        "    os._exit(0)\n"
        "os.wait()\nprint('detached')\n"
    )
    result = run(mode, program, max_processes=4096)
    assert result.passed and result.stdout == "detached\n"
    if contained(mode):  # a pid namespace: killing its init ends every process in it
        assert leftovers(marker) == []
    else:  # NOT contained by the fallback without a pid namespace (the fixture kills the sleeper)
        assert leftovers(marker) != []

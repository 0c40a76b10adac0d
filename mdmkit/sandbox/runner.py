"""Run untrusted generated programs (HumanEval / MBPP checks) in a contained child process.

This is process-level containment for model-written code that is buggy or accidentally destructive. It is
NOT a security boundary like a container, gVisor or a VM: a deliberately malicious program can escape parts of it.
Running code at all is opt-in: set `MDMKIT_ALLOW_CODE_EXECUTION=1` or pass `allow=True`.

How a program runs. `run_program` writes the program into a fresh temporary directory and starts
`python -I -B <wrapper>` there (isolated mode, no bytecode) with `start_new_session=True` (own session and
process group), stdin from /dev/null, and a minimal environment (PATH, HOME=TMPDIR=the temp dir, LC_ALL,
OMP_NUM_THREADS=1, PYTHONDONTWRITEBYTECODE=1; nothing else is inherited). The wrapper (the "intermediate"):

1. tries `unshare(CLONE_NEWNET | CLONE_NEWPID)` through libc (works as root; falls back to each alone, then to
   nothing, silently); the result is reported in `ExecutionResult.protections`;
2. sets rlimits: RLIMIT_AS (memory_mb), RLIMIT_NPROC (max_processes), RLIMIT_FSIZE (max_file_mb),
   RLIMIT_NOFILE (max_open_files), RLIMIT_CORE=0, RLIMIT_CPU (timeout + 1 s);
3. forks the program into a grandchild (pid 1 of the new pid namespace when that worked), so `os.getppid()` in the
   program is never the caller; replaces `socket.socket` / `socket.create_connection` with guards that refuse
   internet sockets; then runs the program and, only if its last line finished, writes a random per-run
   completion token to a private pipe.

What holds:
- wall-clock timeout: the whole process group is SIGKILLed, then every process left in the session is found in
  /proc and SIGKILLed (also done after every normal exit, so background children never outlive a run);
- processes: RLIMIT_NPROC counts all processes of the uid and is IGNORED for root. What holds as root is a watchdog
  in the caller that counts the session's processes in /proc every ~20 ms and kills the session above
  `max_processes`, plus (with the pid namespace) the kernel killing every process of the namespace when its pid 1
  dies. A fork bomb therefore lives for a few tens of milliseconds;
- memory: RLIMIT_AS per process (allocations fail with MemoryError);
- output: stdout and stderr are read concurrently, each kept up to `max_output_bytes`; beyond that the run is
  killed and `truncated=True`; memory in the caller stays bounded;
- early exit: `passed` requires exit status 0 AND the completion token, so `sys.exit(0)` / `os._exit(0)` before the
  appended asserts does not pass. The token is read by the wrapper from a file that it deletes before the
  program starts, and only the wrapper's code after the program writes it; a program that inspects the wrapper's
  frames could forge it (not an accident generated code makes);
- the parent: the program's parent is the throwaway intermediate; with the pid namespace, pids of processes
  outside it (the caller) cannot even be addressed by `kill`, so the caller survives a program that finds its pid
  in /proc;
- network: with the network namespace the program sees only a down loopback device (no route anywhere, not even
  to the host's 127.0.0.1). The socket guard alone (when unshare fails, e.g. not root) is Python-level only:
  `_socket`, ctypes or a subprocess bypass it;
- files: the working directory is a fresh temp dir, deleted afterwards (also after crashes and timeouts of the
  program; not if the caller itself is SIGKILLed).

What does NOT hold:
- the file system is NOT isolated: the program runs with the caller's uid (root here) and can read, write and
  delete anything that uid can, anywhere (no chroot or mount namespace);
- no cgroup limits: total memory of many processes, disk usage (only per-file size), CPU share;
- a program that calls setsid() and leaves the session escapes the sweep when no pid namespace is active;
- signals to other processes, /proc, shared memory, IPC, devices, the kernel attack surface are all as for the
  caller; the Python-level socket guard is not a boundary.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from mdmkit.core.config import Validated, require
from mdmkit.core.errors import MdmkitError

ENV_VAR = "MDMKIT_ALLOW_CODE_EXECUTION"
_READ_CHUNK = 65536
_REPORT_CAP = 4096
_POLL_S = 0.02


class UnsafeExecutionError(MdmkitError):
    """Executing generated code was not explicitly allowed."""


@dataclass
class SandboxLimits(Validated):
    """Per-program limits; see the module docstring for which of them hold when running as root."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64_000

    def validate(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files",
                     "max_output_bytes"):
            value = getattr(self, name)
            require(value > 0, f"{name}={value} must be > 0")
        require(math.isfinite(self.timeout_s), f"timeout_s={self.timeout_s} must be finite")
        require(self.max_open_files >= 16, f"max_open_files={self.max_open_files} must be >= 16 (Python needs some)")


@dataclass
class ExecutionResult:
    """Outcome of one program. `status`: passed | failed | error | timeout | killed; `reason` says why."""

    passed: bool
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool
    reason: str = ""
    protections: tuple[str, ...] = ()  # e.g. ("netns", "pidns", "socket-guard", "rlimits", "session-kill")
    session_id: int | None = None  # the run's session id (= pid of the intermediate), for leak checks


def check_allowed(allow: bool = False) -> None:
    """Raise `UnsafeExecutionError` unless code execution is opted into."""
    if not allow and os.environ.get(ENV_VAR) != "1":
        raise UnsafeExecutionError(
            f"refusing to execute generated code: it is untrusted and the sandbox is not a security boundary; "
            f"set {ENV_VAR}=1 (or pass allow=True) to opt in"
        )


_CHILD = Path(__file__).with_name("child.py")  # the intermediate: rlimits, namespaces, the program


def _session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`, from /proc."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) > 3 and fields[0] != b"Z" and fields[0] != b"X" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def _kill_session(sid: int) -> None:
    """SIGKILL the process group `sid`, then every process left in session `sid`, until none remain."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(200):
        pids = _session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


def _reader(stream, cap: int, sink: bytearray, overflow: threading.Event, wake: threading.Event) -> None:
    """Read `stream` into `sink` up to `cap` bytes; beyond that stop reading and raise `overflow`."""
    try:
        while True:
            chunk = stream.read1(_READ_CHUNK) if hasattr(stream, "read1") else stream.read(_READ_CHUNK)
            if not chunk:
                return
            room = cap - len(sink)
            sink += chunk[:room]
            if len(chunk) > room:
                overflow.set()
                wake.set()
                return
    except (OSError, ValueError):
        return


def _environment(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }


def run_program(source: str, limits: SandboxLimits | None = None, *, allow: bool = False) -> ExecutionResult:
    """Run `source` in the sandbox; `passed` iff it ran to its last line and exited 0 within the limits."""
    check_allowed(allow)
    limits = limits if limits is not None else SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="mdmkit-sandbox-")
    try:
        return _run_in(workdir, source, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir: str, source: str, limits: SandboxLimits) -> ExecutionResult:
    token = secrets.token_hex(16)
    program = os.path.join(workdir, "program.py")
    wrapper = os.path.join(workdir, "_sandbox_wrapper.py")
    config = os.path.join(workdir, "_sandbox_config.json")
    with open(program, "w", encoding="utf-8") as f:
        f.write(source)
    with open(wrapper, "w", encoding="utf-8") as f:
        f.write(_CHILD.read_text())
    report_r, report_w = os.pipe()
    with open(config, "w", encoding="utf-8") as f:
        json.dump({
            "token": token, "report_fd": report_w, "program": program,
            "memory_mb": limits.memory_mb, "max_processes": limits.max_processes,
            "max_file_mb": limits.max_file_mb, "max_open_files": limits.max_open_files,
            "cpu_s": math.ceil(limits.timeout_s) + 1,
        }, f)

    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", wrapper, config],
            cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(report_w,),
            start_new_session=True, close_fds=True,
        )
    except OSError as error:
        os.close(report_r)
        os.close(report_w)
        return ExecutionResult(False, "error", None, "", "", time.monotonic() - start, False,
                               reason=f"could not start the sandbox: {error}")
    os.close(report_w)
    sid = proc.pid

    wake, overflow, report_overflow = threading.Event(), threading.Event(), threading.Event()
    out, err, report = bytearray(), bytearray(), bytearray()
    report_stream = os.fdopen(report_r, "rb", buffering=0)
    readers = [
        threading.Thread(target=_reader, args=(proc.stdout, limits.max_output_bytes, out, overflow, wake), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, limits.max_output_bytes, err, overflow, wake), daemon=True),
        threading.Thread(target=_reader, args=(report_stream, _REPORT_CAP, report, report_overflow, threading.Event()),
                         daemon=True),
    ]

    def wait_exit() -> None:  # waits without reaping, so the session id cannot be reused before the sweep
        try:
            os.waitid(os.P_PID, sid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        wake.set()

    waiter = threading.Thread(target=wait_exit, daemon=True)
    for thread in readers + [waiter]:
        thread.start()

    outcome, reason = None, ""
    deadline = start + limits.timeout_s
    try:
        while waiter.is_alive():
            if overflow.is_set():
                outcome, reason = "killed", f"output exceeded {limits.max_output_bytes} bytes"
                break
            if time.monotonic() >= deadline:
                outcome, reason = "timeout", f"timed out after {limits.timeout_s:g} s"
                break
            count = len(_session_pids(sid))
            if count > limits.max_processes:
                outcome, reason = "killed", f"more than {limits.max_processes} processes"
                break
            wake.wait(min(_POLL_S, max(0.0, deadline - time.monotonic())))
            wake.clear()
    finally:
        _kill_session(sid)  # also after a normal exit: no background process outlives the run
        returncode = proc.wait()
        for thread in readers:
            thread.join(timeout=5)
        waiter.join(timeout=5)
        for stream in (proc.stdout, proc.stderr, report_stream):
            try:
                stream.close()
            except OSError:
                pass
    duration = time.monotonic() - start

    lines = report.decode("utf-8", "replace").splitlines()
    protections: tuple[str, ...] = ()
    signalled = None
    for line in lines:
        if line.startswith("protections "):
            protections = tuple(p for p in line.split(" ", 1)[1].split(",") if p)
        elif line.startswith("signal "):
            signalled = int(line.split()[1]) if line.split()[1].isdigit() else None
    finished = ("done " + token) in lines
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    truncated = overflow.is_set()

    if outcome is None:
        if "syntax-error" in lines:
            outcome, reason = "error", "the program does not compile"
        elif returncode < 0 or signalled is not None:
            number = -returncode if returncode < 0 else signalled
            outcome, reason = "killed", f"killed by signal {_signal_name(number)}"
        elif returncode == 0 and finished:
            outcome, reason = "passed", ""
        elif returncode == 0:
            outcome, reason = "failed", "exited with status 0 before reaching its end (sys.exit/os._exit?)"
        else:
            last = [line for line in stderr.splitlines() if line.strip()]
            outcome = "failed"
            reason = f"exit status {returncode}" + (f": {last[-1].strip()}" if last else "")
    return ExecutionResult(
        passed=outcome == "passed", status=outcome, returncode=returncode, stdout=stdout, stderr=stderr,
        duration_s=duration, truncated=truncated, reason=reason, protections=protections, session_id=sid,
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def run_many(
    sources: list[str],
    limits: SandboxLimits | None = None,
    workers: int = 2,
    progress: bool = True,
    *,
    allow: bool = False,
) -> list[ExecutionResult]:
    """Run every program (in parallel threads, one subprocess each); results in input order."""
    check_allowed(allow)
    require(workers >= 1, f"workers={workers} must be >= 1")
    limits = limits if limits is not None else SandboxLimits()
    results: list[ExecutionResult | None] = [None] * len(sources)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_program, source, limits, allow=True): i for i, source in enumerate(sources)}
        with tqdm(total=len(sources), disable=not progress, desc="sandbox", unit="prog") as bar:
            for future in as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as error:  # noqa: BLE001 -- one sandbox failure never loses the others
                    results[i] = ExecutionResult(False, "error", None, "", "", 0.0, False,
                                                 reason=f"sandbox error: {error!r}")
                bar.update(1)
    return results  # type: ignore[return-value]

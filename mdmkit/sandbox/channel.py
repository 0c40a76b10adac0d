"""One running sandbox seen from the caller: start it, exchange frames under a deadline, stop it completely.

All waiting happens in `_exchange`, one selector over the reply pipe, the program's stdout and stderr and a
pidfd: output is drained as it comes (kept up to a cap), the watchdog runs every 20 ms, and the deadline is
checked on every wake-up, so the caller never blocks past the timeout, whatever the program does with its
pipes. The sandbox's first frame is a handshake its trusted start-up writes once confined, before any candidate
code runs: without it, a failure is the sandbox's (it did not start), with it, the program's. What protected a
run is what the caller set up or sees in /proc, never what the program says. `stop` kills the whole sandbox
(cgroup, pid namespace, process tree, session); processes that survive are reported, and no later sandbox
starts in this process while they live.
"""

from __future__ import annotations

import marshal
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import IO, NoReturn

from mdmkit.core.errors import MdmkitError
from mdmkit.sandbox import cgroups, codec, procs, uids
from mdmkit.sandbox.isolation import Backend, bwrap_argv, interpreter
from mdmkit.sandbox.limits import SandboxLimits

_POLL_S = 0.02
_CHUNK = 65536
_READY = {"ready": True}
_leaked: list[tuple[int, bytes]] = []  # processes that survived a sandbox's SIGKILL, as `procs.identities`
_leaked_lock = threading.Lock()
# Reads the compiled sandbox-side modules (`_payload`) from the request pipe and serves (see child.py).
_BOOT = """import marshal, os, sys, types
r, w = int(sys.argv[1]), int(sys.argv[2])
def rd(n):
    b = b""
    while len(b) < n:
        c = os.read(r, n - len(b))
        if not c:
            os._exit(0)
        b += c
    return b
codes = marshal.loads(rd(int.from_bytes(rd(4), "big")))
for name in ("mdmkit", "mdmkit.sandbox"):
    sys.modules[name] = types.ModuleType(name)
for name, code in codes:
    m = sys.modules[name] = types.ModuleType(name)
    exec(code, m.__dict__)
    setattr(sys.modules["mdmkit.sandbox"], name.rsplit(".", 1)[1], m)
sys.modules["mdmkit.sandbox.child"].main(r, w)
"""


@lru_cache(maxsize=1)
def _payload() -> bytes:
    here = Path(__file__).parent
    codes = [(f"mdmkit.sandbox.{name}", compile((here / f"{name}.py").read_text(), f"{name}.py", "exec"))
             for name in ("codec", "confine", "mounts", "child")]
    body = marshal.dumps(codes)
    return len(body).to_bytes(4, "big") + body


class Stopped(BaseException):
    """The sandbox stopped before answering (timeout, a limit, or the program ended); not an `Exception`, so
    the dataset's checks cannot swallow it."""


class LeftoverProcesses(MdmkitError):
    """Processes of an earlier sandbox survived SIGKILL; running more programs beside them is refused."""


def _refuse_if_leaked() -> None:
    with _leaked_lock:
        left = procs.kill_until_gone(lambda: procs.alive(_leaked)) if _leaked else []
        _leaked[:] = [entry for entry in _leaked if entry[0] in left]
        if _leaked:
            raise LeftoverProcesses(
                f"processes {[pid for pid, _ in _leaked]} of an earlier sandbox survived SIGKILL; refusing to run "
                "more programs in this process until they are gone")


class Sandbox:
    """A sandbox process: `start`, then `request` frames, then `stop` (always; also after `Stopped`)."""

    def __init__(self, limits: SandboxLimits, backend: Backend):
        self.limits, self.backend = limits, backend
        self.status, self.reason = "", ""  # set once the sandbox was halted (timeout, killed, ended)
        self.stdout, self.stderr = bytearray(), bytearray()
        self.truncated = False
        self.returncode: int | None = None
        self.protections: list[str] = [backend.name] if not backend.fallback else []
        self.survivors: list[int] = []
        self._reply, self._reply_eof = bytearray(), False
        self._preamble, self._ready, self._answered = b"", False, False
        self._unsent = memoryview(b"")
        self._req: int | None = None  # the pipes' and the process's ends, once started
        self._rep: int | None = None
        self._pidfd: int | None = None
        self._cgroup: cgroups.Cgroup | None = None
        self._workdir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._selector = selectors.DefaultSelector()
        self.deadline = time.monotonic() + limits.timeout_s

    # -- start ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        _refuse_if_leaked()
        python, _ = interpreter()
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        argv = [python, "-I", "-S", "-B", "-c", _BOOT, str(req_r), str(rep_w)]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        if self.backend.fallback:
            self._workdir = cwd = tempfile.mkdtemp(prefix="mdmkit-sandbox-")
            env.update(HOME=cwd, TMPDIR=cwd)
        else:
            argv, cwd = bwrap_argv(self.limits.disk_mb) + argv, "/"
            env.update(HOME="/tmp", TMPDIR="/tmp")
        parent, _ = cgroups.parent()
        if parent is not None:
            try:
                self._cgroup = cgroups.Cgroup(parent, self.limits.memory_mb, self.limits.max_processes)
                argv = self._cgroup.wrap(argv)
                self.protections.append("cgroup")
            except OSError:  # the hierarchy changed since the probe: the watchdog takes over
                self._cgroup = None
        try:
            self._proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, pass_fds=(req_r, rep_w), close_fds=True,
                                          start_new_session=True)
        finally:
            os.close(req_r)
            os.close(rep_w)
        stdout, stderr = _piped(self._proc.stdout), _piped(self._proc.stderr)
        for fd in (self._req, self._rep, stdout.fileno(), stderr.fileno()):
            os.set_blocking(fd, False)
        self._selector.register(self._rep, selectors.EVENT_READ, "reply")
        self._selector.register(stdout, selectors.EVENT_READ, "stdout")
        self._selector.register(stderr, selectors.EVENT_READ, "stderr")
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
            self._selector.register(self._pidfd, selectors.EVENT_READ, "exit")
        except (AttributeError, OSError):  # no pidfd (old kernel): the reply pipe's end of file tells instead
            self._pidfd = None
        config = {"fallback": self.backend.fallback, "memory_mb": self.limits.memory_mb,
                  "max_processes": self.limits.max_processes, "max_file_mb": self.limits.max_file_mb,
                  "max_open_files": self.limits.max_open_files, "cpu_s": int(self.limits.timeout_s) + 2,
                  "disk_mb": self.limits.disk_mb, "workdir": self._workdir,
                  "uid": uids.allocate() if os.geteuid() == 0 else None}  # never host root, nor a shared uid
        self._preamble = _payload() + codec.pack(config)  # sent with the first request: one round trip
        self.protections += ["rlimits"] + ([] if self._cgroup else ["watchdog"])

    # -- exchange ------------------------------------------------------------------------------------------
    def request(self, message: dict) -> dict:
        data, self._preamble = self._preamble + codec.pack(message), b""
        if not self._ready:
            if self._exchange(data) != _READY:  # only the trusted start-up writes before the handshake
                self.halt("error", "could not start the sandbox: its start-up broke the protocol")
            self._ready, data = True, b""
            self._observe()
        reply = self._exchange(data)
        self._answered = True
        return reply

    def _observe(self) -> None:
        """What confines the sandbox's first process, as /proc shows it (the candidate has not run yet)."""
        members = self._members()
        if members:
            writable = tuple(filter(None, ("/tmp", "/dev/shm", self._workdir)))
            self.protections += procs.confinement(members[-1], writable)

    def _exchange(self, data: bytes) -> dict:
        """Send `data` (after what is left of earlier data), then wait for one reply frame; raises `Stopped`
        (after halting) when none can come."""
        if self.status:
            raise Stopped(self.reason)
        assert self._req is not None, "started"
        self._unsent = pending = memoryview(bytes(self._unsent) + data)  # a reply can come before all is sent
        writing = bool(pending)
        if writing:
            self._selector.register(self._req, selectors.EVENT_WRITE, "request")
        next_watch = time.monotonic() + _POLL_S
        try:
            while True:
                now = time.monotonic()
                if now >= self.deadline:
                    self.halt("timeout", f"timed out after {self.limits.timeout_s:g} s")
                if now >= next_watch:
                    self._watch()
                    next_watch = now + _POLL_S
                if not writing and (message := self._next_frame()) is not None:  # came with the last one
                    return self._accepted(message)
                for key, _ in self._selector.select(max(0.0, min(next_watch, self.deadline) - now)):
                    if key.data == "request":
                        self._unsent = pending = pending[self._write(pending):]
                        if not pending:
                            self._selector.unregister(self._req)
                            writing = False
                    elif key.data in ("reply", "exit"):  # after an exit, a last reply may still sit in the pipe
                        message = self._read_reply()
                        if message is not None:
                            return self._accepted(message)
                        if key.data == "exit":
                            self._ended()
                    else:
                        self._drain(key.fd, key.data)
        finally:
            if writing:
                self._selector.unregister(self._req)

    def _accepted(self, message: dict) -> dict:
        if not self._answered or "ok" not in message:  # loading, or a failure: was it a limit?
            self._watch()  # the cause (a fork refused by RLIMIT_NPROC)? then that decides
        return message

    def _write(self, pending: memoryview) -> int:
        assert self._req is not None, "started"
        try:
            return os.write(self._req, pending[:_CHUNK])
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            self._ended()

    def _read_reply(self) -> dict | None:
        """A complete reply frame if one has arrived (at most max_reply_bytes are ever buffered)."""
        assert self._rep is not None, "started"
        cap = self.limits.max_reply_bytes + 4
        while len(self._reply) <= cap:
            try:
                chunk = os.read(self._rep, _CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self._reply_eof = True
                break
            self._reply += chunk
        message = self._next_frame()
        if message is None and self._reply_eof:
            self._ended()
        return message

    def _next_frame(self) -> dict | None:
        if len(self._reply) < 4:
            return None
        length = codec.header_length(bytes(self._reply[:4]))
        if length > self.limits.max_reply_bytes:
            cap = self.limits.max_reply_bytes
            self.halt("failed", f"a reply of {length} bytes, more than max_reply_bytes={cap}")
        if len(self._reply) < 4 + length:
            return None
        body, self._reply = bytes(self._reply[4:4 + length]), self._reply[4 + length:]
        try:
            message = codec.unpack(body)
        except codec.WireError as error:
            self.reject(str(error))
        if type(message) is not dict:
            self.reject("a frame that is not an object")
        return message

    def reject(self, why: str) -> NoReturn:
        """The program broke the protocol: that fails it, and no check can catch it (raises `Stopped`)."""
        self.halt("failed", f"the program answered with something that is not plain data ({why})")

    def _drain(self, fd: int, name: str) -> None:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self._selector.unregister(fd)
            return
        sink = self.stdout if name == "stdout" else self.stderr
        room = self.limits.max_output_bytes - len(sink)
        sink += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
            self.halt("killed", f"output exceeded {self.limits.max_output_bytes} bytes")

    # -- watchdog and ends ---------------------------------------------------------------------------------
    def _members(self) -> list[int]:
        if self._proc is None:
            return []
        members = procs.tree(self._proc.pid)
        if self.backend.fallback:  # without a pid namespace, orphans leave the tree but keep the session
            members += [pid for pid in procs.session(self._proc.pid) if pid not in members]
        return members

    def _watch(self) -> None:
        if self._cgroup is not None:
            breach = self._cgroup.breach()
            if breach:
                limit = self.limits.memory_mb if breach == "memory" else self.limits.max_processes
                unit = "MB" if breach == "memory" else "tasks"
                self.halt("killed", f"the sandbox reached its {breach} limit ({limit} {unit}, cgroup)")
            return
        members = self._members()
        tasks, rss = procs.usage(members)
        rss += procs.private_tmpfs_bytes(members[1:], ("/tmp", "/dev/shm"))
        if tasks > self.limits.max_processes:
            self.halt("killed", f"more than {self.limits.max_processes} tasks (processes and threads)")
        if rss > self.limits.memory_mb * 1024 * 1024:
            self.halt("killed", f"more than {self.limits.memory_mb} MB of memory in all its processes")

    def _ended(self) -> NoReturn:
        """The sandbox's main process exited (or closed its pipes) without answering."""
        assert self._proc is not None, "started"
        try:
            code = self._proc.wait(timeout=max(0.0, min(0.5, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            code = None
        self.returncode = code
        self._drain_rest(_piped(self._proc.stderr), "stderr")
        self._watch()  # a limit the kernel enforced (an OOM kill in the cgroup) is why it ended
        if not self._ready:  # bwrap or the start-up failed: no candidate code ran, so stderr is theirs
            last = (self.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            self.halt("error", f"could not start the sandbox (exit status {code}): {last[:300]}")
        if code is not None and (code < 0 or code > 128) and self._signal_name(code):
            self.halt("killed", f"killed by signal {self._signal_name(code)}")
        self.halt("failed", f"the program ended before answering (exit status {code})")

    @staticmethod
    def _signal_name(code: int) -> str:
        number = -code if code < 0 else code - 128
        try:
            return signal.Signals(number).name
        except ValueError:
            return ""

    def halt(self, status: str, reason: str) -> NoReturn:
        """Record why the sandbox stopped (the first reason wins) and raise `Stopped`."""
        if not self.status:
            self.status, self.reason = status, reason
        raise Stopped(reason)

    # -- stop ----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kill everything of the sandbox, keep its last output, release pipes, cgroup and temp dir."""
        try:
            in_cgroup = procs.identities(self._cgroup.kill()) if self._cgroup is not None else []
            if self._proc is not None:
                # Killing a pid namespace's init ends the namespace; the snapshot also covers the fallback.
                snapshot = procs.identities(self._members())
                left = procs.kill_until_gone(lambda: sorted(set(procs.alive(snapshot)) | set(self._members())))
                self.survivors = sorted(set(left) | set(procs.alive(in_cgroup)))
                if self.survivors:
                    with _leaked_lock:
                        _leaked.extend(procs.identities(self.survivors))
                    self.status, self.reason = "killed", (
                        f"processes {self.survivors} survived SIGKILL; no more programs run in this process "
                        "until they are gone")
                if not left:
                    self._proc.wait()  # `returncode` stays None unless the program ended on its own
                for stream, name in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
                    self._drain_rest(_piped(stream), name)
        finally:
            self._selector.close()
            for fd in (self._req, self._rep, self._pidfd):
                if fd is not None:
                    os.close(fd)
            if self._proc is not None:
                _piped(self._proc.stdout).close()
                _piped(self._proc.stderr).close()
            if self._cgroup is not None:
                self._cgroup.remove()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)

    def _drain_rest(self, stream: IO[bytes], name: str) -> None:
        sink = self.stdout if name == "stdout" else self.stderr
        while len(sink) < self.limits.max_output_bytes:
            try:
                chunk = os.read(stream.fileno(), _CHUNK)
            except (BlockingIOError, OSError, ValueError):
                return
            if not chunk:
                return
            sink += chunk[: self.limits.max_output_bytes - len(sink)]


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    """One of the sandbox's output streams, which it is started with pipes for."""
    assert stream is not None, "started with stdout=PIPE and stderr=PIPE"
    return stream

"""The candidate's side of the sandbox: load the solution, then answer calls with plain data.

Runs inside the sandbox on a bare interpreter (`python -I -S`), shipped as compiled code together with
`codec` (see `channel.py`), so it needs only the standard library. It holds no secret and decides no verdict:
the candidate controls this interpreter completely, and whatever it sends back is only data that the trusted
checks on the caller's side compare.

The first frame on `req_fd` configures (limits, fallback, uid, working directory); once confined, the sandbox writes
{"ready": true} on `rep_fd`; after it, frames on `rep_fd` answer those on `req_fd` one for one:
`load` -> {"ok": "loaded"} | {"error": kind, "message": ...}; `call` -> {"ok": value} |
{"raised": exception name, "message": ...}.
"""

from __future__ import annotations

import builtins
import os
import resource
import sys
import types

from mdmkit.sandbox import codec, confine, mounts

TYPE_CHECKING = False  # typing is not imported in the sandbox: annotations stay strings there
if TYPE_CHECKING:
    from typing import Any

    from mdmkit.sandbox.codec import Wire


def read_frame(fd: int) -> Any:
    """The next message on `fd`, or None at end of file."""
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    body = _read_exactly(fd, codec.header_length(header))
    return None if body is None else codec.unpack(body)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write(fd: int, message: object) -> None:
    data = codec.pack(message)
    while data:
        data = data[os.write(fd, data):]


def _limit(config: dict[str, Any]) -> None:
    """rlimits: the kernel's per-process bounds (cgroups, where there are any, bound the whole sandbox). The
    process count is a backstop a little above the watchdog's, so that the watchdog decides where it can."""
    mb = 1024 * 1024
    for name, value in (("RLIMIT_AS", config["memory_mb"] * mb), ("RLIMIT_NPROC", config["max_processes"] + 2),
                        ("RLIMIT_FSIZE", config["max_file_mb"] * mb), ("RLIMIT_NOFILE", config["max_open_files"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_CPU", config["cpu_s"])):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass


_SOURCES: dict[str, str] = {}  # file name -> source, for tracebacks


def _report(error: BaseException, skip_frames: int = 1) -> str:
    """Print the candidate's traceback to stderr (the caller keeps it); a one-line summary of `error`."""
    import linecache
    import traceback

    for name, source in _SOURCES.items():
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tb = error.__traceback__
    for _ in range(skip_frames):
        tb = tb.tb_next if tb is not None else None
    try:
        traceback.print_exception(type(error), error, tb)
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except BaseException:  # noqa: BLE001 -- a hostile __str__ must not stop the reply
        text = type(error).__name__
    return text[:500]


def _load(message: dict[str, Any], namespace: dict[str, Any]) -> dict[str, str]:
    """Run the solution, then the dataset's setup code, as `__main__`; a reply saying how it went."""
    for name, source in (("program.py", message["solution"]), ("setup.py", message.get("setup") or "")):
        if not source:
            continue
        _SOURCES[name] = source
        try:
            code = compile(source, name, "exec")
        except (SyntaxError, ValueError) as error:
            return {"error": "syntax", "message": _report(error, skip_frames=99)}
        try:
            exec(code, namespace)  # noqa: S102 -- the candidate's code, which this whole sandbox is for
        except BaseException as error:  # noqa: BLE001 -- SystemExit included: exiting early is not loading
            return {"error": "exception", "message": _report(error)}
    return {"ok": "loaded"}


_HANDLES: list[object] = []  # objects returned as opaque handles, which the checks may pass back as arguments


def _call(message: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Wire]:
    def resolve(tag: str, value: Any) -> Any:
        if tag == "ref" and value in namespace:
            return namespace[value]
        if tag == "handle" and type(value) is int and 0 <= value < len(_HANDLES):
            return _HANDLES[value]
        if tag == "builtin" and hasattr(builtins, str(value)):
            return getattr(builtins, value)
        raise NameError(f"name {value!r} is not defined" if tag == "ref" else f"no {tag} {value!r} here")

    try:
        function = resolve("ref", message["name"])
        args = codec.from_wire(message["args"], resolve)
        kwargs = codec.from_wire(message["kwargs"], resolve)
        result = function(*args, **kwargs)
        return {"ok": codec.to_wire(result, _HANDLES)}
    except BaseException as error:  # noqa: BLE001 -- everything the candidate raises is reported, not fatal
        return {"raised": type(error).__name__[:100], "message": _report(error)}


def serve(req_fd: int, rep_fd: int, namespace: dict[str, Any]) -> None:
    """Answer requests until the caller closes the pipe."""
    while True:
        message = read_frame(req_fd)
        if message is None:
            return
        reply = _load(message, namespace) if message.get("op") == "load" else _call(message, namespace)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001, S110 -- the candidate may have replaced or closed them
                pass
        _write(rep_fd, reply)


def main(req_fd: int, rep_fd: int) -> None:
    """Configure from the first frame, confine this interpreter, say so (the handshake: the caller now knows
    the sandbox started, before any candidate code ran), then serve. The fallback serves from a forked
    grandchild, the first process of its new pid namespace."""
    config = read_frame(req_fd)
    if config is None:
        os._exit(0)
    uid, workdir = config["uid"], config["workdir"]
    if config["fallback"]:
        isolated = confine.namespaces()
        pid = os.fork()
        if pid:
            os.close(req_fd)
            os.close(rep_fd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            os._exit(128 - code if code < 0 else code)  # killed by signal N: 128 + N, as a shell reports it
        if isolated:
            mounts.private_view(workdir, config["disk_mb"], sys.base_prefix, reach=uid is not None)
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chdir(workdir)
    confine.drop_privileges(uid)
    confine.fresh_keyring()
    _limit(config)
    confine.seccomp()
    _write(rep_fd, {"ready": True})
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    module.__file__ = "program.py"
    sys.modules["__main__"] = module
    sys.argv = ["program.py"]
    serve(req_fd, rep_fd, module.__dict__)
    os._exit(0)

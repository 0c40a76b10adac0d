"""The sandbox's intermediate process: run as the child's main script (`python -I -B child.py <config.json>`).

Self-contained on purpose (standard library only): it runs in isolated mode inside the sandbox's temp dir.
"""

import ctypes
import json
import os
import resource
import sys
import traceback


def _main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    os.unlink(sys.argv[1])
    token = cfg["token"]
    report = cfg["report_fd"]
    protections = []

    def say(line):
        try:
            os.write(report, (line + "\n").encode())
        except OSError:
            pass

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        NEWNET, NEWPID = 0x40000000, 0x20000000
        if libc.unshare(NEWNET | NEWPID) == 0:
            protections += ["netns", "pidns"]
        else:
            for flag, name in ((NEWNET, "netns"), (NEWPID, "pidns")):
                if libc.unshare(flag) == 0:
                    protections.append(name)
    except Exception:
        pass

    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
        (resource.RLIMIT_NPROC, cfg["max_processes"]),
        (resource.RLIMIT_FSIZE, cfg["max_file_mb"] * mb),
        (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
    ]
    for which, value in limits:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    protections += ["rlimits", "socket-guard", "session-kill"]
    say("protections " + ",".join(protections))

    pid = os.fork()
    if pid == 0:
        _program(cfg["program"], token, report, say)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        say(f"signal {os.WTERMSIG(status)}")
        os._exit(128 + os.WTERMSIG(status))
    code = os.WEXITSTATUS(status)
    say(f"exit {code}")
    os._exit(code)

def _program(path, token, report, say):
    import builtins
    import socket

    class _GuardedSocket(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if family != socket.AF_UNIX:
                raise PermissionError("network access is disabled in the sandbox")
            super().__init__(family, type, proto, fileno)

    def _denied(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = _GuardedSocket
    socket.SocketType = _GuardedSocket
    socket.create_connection = _denied
    socket.create_server = _denied

    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        code = compile(source, path, "exec")
    except (SyntaxError, ValueError, UnicodeDecodeError):
        say("syntax-error")
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.argv = [path]
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": builtins, "__doc__": None}
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as error:
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.stderr.flush()
        os._exit(1)
    say("done " + token)
    sys.exit(0)


if __name__ == "__main__":
    _main()

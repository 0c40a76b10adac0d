"""Verdicts the candidate cannot forge: the dataset's checks run in the caller, the candidate only answers calls.

A `Check` splits a benchmark program in two. The candidate's `solution` (and the dataset's `setup`, which builds
objects from the solution's classes) runs in the sandbox; the dataset's `tests` run here, in the trusted
caller, where every name in `remote` is a proxy that calls into the sandbox and gets back plain data only
(`codec.from_wire`: exact built-in types, checked recursively). A pass is decided by the trusted `assert`s
completing, never by anything the sandbox says or does, so printing a token, patching `os._exit`, returning an
object whose `__eq__` is always true, or writing forged frames cannot produce one. A bare script (no tests)
passes when it loads; that is a convenience, not a verdict (its "loaded" reply can be forged).
"""

from __future__ import annotations

import builtins
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from mdmkit.sandbox import codec
from mdmkit.sandbox.channel import Sandbox, Stopped
from mdmkit.sandbox.isolation import Backend
from mdmkit.sandbox.limits import ExecutionResult, SandboxLimits

if TYPE_CHECKING:
    from _typeshed import TraceFunction

_TESTS, _PRELUDE = "<checks>", "<checks prelude>"
CHECKS_GRACE_S = 1.0  # the checks may run this long past the program's timeout, then they are stopped
# Raised by the candidate, these would steer the checks' own control flow (a StopIteration ends the `map` an
# `all(...)` reads, passing it); they arrive as an ordinary failure instead.
_CONTROL_FLOW = ("StopIteration", "StopAsyncIteration", "GeneratorExit")
_BUILTINS = {**vars(builtins), "print": lambda *args, **kwargs: None}  # the checks never write to our stdout


@dataclass(frozen=True)
class Check:
    """A candidate solution and the dataset's checks for it.

    solution: the candidate's code (untrusted; runs in the sandbox). setup: dataset code run in the sandbox
    after it (objects of the solution's classes, e.g. MBPP's trees). prelude: dataset code run here before the
    tests (helpers the tests call, e.g. HumanEval's `poly`). tests: the dataset's asserts, run here.
    remote: the names the tests reach in the sandbox (the entry point, setup objects).
    """

    solution: str
    tests: str = ""
    remote: tuple[str, ...] = ()
    prelude: str = ""
    setup: str = ""


class CandidateError(Exception):
    """The candidate raised an exception that has no built-in counterpart here."""


class Remote(codec.Ref):
    """A name in the sandbox: calling it calls the candidate; passing it sends a reference."""

    __slots__ = ("_box",)

    def __init__(self, name: str, box: Sandbox):
        super().__init__(name)
        self._box = box

    def __call__(self, *args: object, **kwargs: object) -> Any:
        reply = self._box.request({"op": "call", "name": self.name, "args": codec.to_wire(list(args)),
                                   "kwargs": codec.to_wire(dict(kwargs))})
        if "ok" in reply:
            budget = min(codec.REPLY_BUDGET, self._box.limits.memory_mb * 2**20)  # no more than the program had
            try:
                return codec.from_wire(reply["ok"], budget=budget)
            except codec.WireError as error:
                self._box.reject(str(error))  # raises Stopped: no check can catch a protocol violation
        name = str(reply.get("raised", "?"))[:100]
        raise _candidate_exception(name, str(reply.get("message", ""))[:500].removeprefix(name).removeprefix(": "))

    def __repr__(self) -> str:
        return f"<candidate's {self.name}>"


def _candidate_exception(name: str, message: str) -> Exception:
    """The built-in exception the candidate raised (so `except ValueError` in a check still works)."""
    kind = getattr(builtins, name, None)
    error: Exception = CandidateError(f"{name}: {message}")
    if isinstance(kind, type) and issubclass(kind, Exception) and name not in _CONTROL_FLOW:
        try:
            error = kind(message)
        except TypeError:  # built-ins with other signatures (UnicodeDecodeError, ...)
            pass
    error.raised_by_candidate = True  # type: ignore[attr-defined]  # a mark on the instance, read by _exec_tests
    return error


def _where(error: BaseException, source: str) -> str:
    """ "line N of the checks: <source line>" for the innermost frame in the checks' code."""
    lines = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == _TESTS]
    if not lines:
        return ""
    number = lines[-1].lineno or 0
    text = source.splitlines()[number - 1].strip() if 0 < number <= len(source.splitlines()) else ""
    return f" at line {number} of the checks: {text[:160]}"


def run_check(check: Check, limits: SandboxLimits, backend: Backend) -> ExecutionResult:
    """Load the solution in a fresh sandbox, run the checks here against it, and stop the sandbox."""
    start = time.monotonic()
    box = Sandbox(limits, backend)
    status, reason = "passed", ""
    try:
        box.start()
        loaded = box.request({"op": "load", "solution": check.solution, "setup": check.setup})
        if "ok" not in loaded:
            status = "error" if loaded.get("error") == "syntax" else "failed"
            reason = ("the program does not compile: " if status == "error" else "loading the program raised ") \
                + str(loaded.get("message", ""))[:300]
        elif check.tests:
            status, reason = _run_tests(check, box)
    except Stopped:
        pass
    except OSError as error:
        status, reason = "error", f"could not start the sandbox: {error}"
    finally:
        box.stop()
    if box.status:  # halted: timeout, a limit, or the program ended; that decides, whatever the checks did
        status, reason = box.status, box.reason
    return ExecutionResult(
        passed=status == "passed", status=status, returncode=box.returncode,
        stdout=box.stdout.decode("utf-8", "replace"), stderr=box.stderr.decode("utf-8", "replace"),
        duration_s=time.monotonic() - start, truncated=box.truncated, reason=reason, isolation=backend.name,
        protections=tuple(box.protections))


def _run_tests(check: Check, box: Sandbox) -> tuple[str, str]:
    namespace: dict[str, object] = {"__name__": "__checks__", "__builtins__": _BUILTINS}
    try:
        exec(compile(check.prelude, _PRELUDE, "exec"), namespace)  # noqa: S102 -- the dataset's own code
    except Exception as error:  # noqa: BLE001
        return "error", f"the checks' prelude raised {type(error).__name__}: {error}"
    namespace.update({name: Remote(name, box) for name in check.remote})
    with _bounded_int_parsing():  # entered and left untraced: the deadline never stops it halfway
        return _exec_tests(check, box, namespace)


def _exec_tests(check: Check, box: Sandbox, namespace: dict[str, object]) -> tuple[str, str]:
    previous = sys.gettrace()
    sys.settrace(_deadline_tracer(box, box.deadline + CHECKS_GRACE_S))
    try:
        exec(compile(check.tests, _TESTS, "exec"), namespace)  # noqa: S102 -- the dataset's own asserts
    except Exception as error:  # noqa: BLE001 -- any failing check fails the program
        where = _where(error, check.tests)
        if getattr(error, "raised_by_candidate", False):
            return "failed", f"the candidate raised {type(error).__name__}: {str(error)[:300]}{where}"
        if isinstance(error, AssertionError):
            return "failed", f"AssertionError{where}" + (f" ({error})" if str(error) else "")
        return "failed", f"{type(error).__name__}: {str(error)[:300]}{where}"
    finally:
        sys.settrace(previous)
    return "passed", ""


_digits_lock = threading.Lock()
_digits_users = 0  # checks running now, in threads of this process (`run_many`)
_digits_restore: int | None = None  # the process's own bound, while the checks run with a tighter one


@contextmanager
def _bounded_int_parsing() -> Iterator[None]:
    """While any checks run, CPython's int max-str-digits bound is at most `codec.MAX_INT_DIGITS`: a check's
    `int(candidate())` of a long digit string is quadratic in its length (seconds for 10**6 digits, in one C
    call no deadline interrupts), and the process may have lifted the bound (PYTHONINTMAXSTRDIGITS=0). The
    setting is process-wide, so the first checks to start set it and the last to end restore it."""
    global _digits_users, _digits_restore
    get = getattr(sys, "get_int_max_str_digits", None)  # Python 3.10 before 3.10.7 has no such bound
    with _digits_lock:
        if _digits_users == 0 and get is not None and not 0 < get() <= codec.MAX_INT_DIGITS:
            _digits_restore = get()
            sys.set_int_max_str_digits(codec.MAX_INT_DIGITS)
        _digits_users += 1
    try:
        yield
    finally:
        with _digits_lock:
            _digits_users -= 1
            if _digits_users == 0 and _digits_restore is not None:
                sys.set_int_max_str_digits(_digits_restore)
                _digits_restore = None


def _deadline_tracer(box: Sandbox, deadline: float, clock: Callable[[], float] = time.monotonic) -> TraceFunction:
    """A trace function that stops the checks (`Stopped`, which they cannot catch for good) at every function
    call and every line of the checks' own code past `deadline`. Values from the sandbox are bounded
    (`codec`), so no single line on them runs long; a loop over one is stopped here."""

    def on_line(frame: FrameType, event: str, arg: object) -> TraceFunction:
        if clock() > deadline:
            box.halt("timeout", f"the checks ran past the program's timeout ({box.limits.timeout_s:g} s) plus "
                                f"{CHECKS_GRACE_S:g} s")
        return on_line

    def on_call(frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        on_line(frame, event, arg)
        return on_line if frame.f_code.co_filename in (_TESTS, _PRELUDE) else None

    return on_call

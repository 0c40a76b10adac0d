"""Plain data across the sandbox's pipes: the only thing a candidate can hand back to the trusted checks.

Both sides import this module (the sandbox gets it shipped as compiled code; standard library only). The
candidate side turns any return value into JSON (`to_wire`, lenient: subclasses of built-in types become their
base type, a few standard-library value types keep their identity, anything else becomes an opaque handle).
The trusted side rebuilds values with `from_wire`, which accepts nothing but JSON's own types and the tags below
and builds only exact built-in types (plus those standard-library types, from plain data): no object the
candidate defined, so no `__eq__` of its own, ever reaches a comparison in the checks. What it builds is charged
against a byte budget (`Budget`), ranges at their expanded size, so a small reply cannot cost the caller much
memory. An opaque handle is equal only to itself; passed back as an argument it becomes the candidate's object
again (MBPP's `Pair(5, 24)`).
"""

from __future__ import annotations

import builtins
import collections
import json
import struct
import sys

TYPE_CHECKING = False  # typing is not imported in the sandbox: annotations stay strings there
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeAlias, TypeVar

    T = TypeVar("T")
    Wire: TypeAlias = None | bool | int | float | str | list["Wire"] | dict[str, "Wire"]  # JSON's types
    Resolve = Callable[[str, Any], Any]  # a `ref`, `handle` or `builtin` tag and its value -> the object

MAX_DEPTH = 64
MAX_ITEMS = 200_000  # items taken from one iterator the candidate returns
# Bytes of CPython memory the trusted side may spend rebuilding one reply (the caller passes the smaller of this
# and the program's memory limit): it rebuilds outside the sandbox's limit, and a check may expand what it gets.
REPLY_BUDGET = 64 * 2**20
MAX_SHARED_HASHES = 64  # keys of one set or mapping that share one hash: inserting them is quadratic in their number
# Numbers the trusted checks may compute with in time linear in a reply: int(Decimal('1e999999999')) would take
# forever from 14 bytes, and parsing a long digit string is quadratic (CPython's own default bound).
MAX_INT_DIGITS = 4300
MAX_DECIMAL_EXPONENT = 4300
_INT_BOUND = 10**MAX_INT_DIGITS  # the smallest integer of more than MAX_INT_DIGITS digits
_HEADER = struct.Struct(">I")
_POINTER = struct.calcsize("P")  # what holding one more object costs its container


class WireError(ValueError):
    """A frame that is not plain data of the agreed shape."""


class Budget:
    """What rebuilding one reply may still cost the trusted side, in bytes of CPython memory.

    Item counts do not bound memory: a range of 200,000 items of 4,000 digits is 50 bytes on the wire and 340 MB
    once a check's `tuple(...)` expands it. So each rebuilt node is charged what it occupies (`sys.getsizeof`,
    plus the pointer its container holds), and a range what expanding it would occupy.
    """

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def take(self, value: T, extra: int = 0) -> T:
        """`value`, charged its own size plus `extra` (what it refers to that no other node was charged for)."""
        self.spent += sys.getsizeof(value) + _POINTER + extra
        if self.spent > self.limit:  # described only then: this runs for every node
            name = type(value).__name__
            self.charge(0, f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}")
        return value

    def charge(self, nbytes: int, what: str) -> None:
        self.spent += nbytes
        if self.spent > self.limit:
            raise WireError(f"rebuilding the reply would take at least {_size(self.spent)} of the caller's memory "
                            f"({what}), beyond its budget of {_size(self.limit)} per reply")


def _size(nbytes: int) -> str:
    if nbytes >= 10**18:  # a range's expanded size can have thousands of digits: no float, no str() of it
        return f"about 10**{int((nbytes.bit_length() - 21) * 0.30103)} MB"
    return f"{nbytes / 2**20:,.1f} MB".replace(".0 MB", " MB") if nbytes >= 2**20 // 10 else f"{nbytes:,} bytes"


class Ref:
    """A name in the sandbox's namespace, sent as an argument (MBPP's setup objects)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Opaque:
    """Stands in for a candidate's object that is not plain data: equal only to itself."""

    __slots__ = ("handle", "kind", "text")

    def __init__(self, kind: str, text: str, handle: int | None = None) -> None:
        self.kind, self.text, self.handle = kind, text, handle

    def __repr__(self) -> str:
        return f"<opaque {self.kind}: {self.text}>"


_MAPPINGS: tuple[tuple[type[dict], str], ...] = (
    (collections.Counter, "Counter"), (collections.OrderedDict, "OrderedDict"), (dict, "dict"))
_SEQUENCES: tuple[tuple[type, str], ...] = (
    (tuple, "tuple"), (list, "list"), (frozenset, "frozenset"), (set, "set"), (collections.deque, "deque"))
_VIEWS = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}


def to_wire(value: Any, handles: list[object] | None = None, depth: int = 0) -> Wire:
    """JSON-ready form of `value`. `handles` (candidate side) keeps objects that are not plain data, so that
    they can come back as arguments; without it they travel as opaque stand-ins."""
    if depth > MAX_DEPTH:
        return {"t": "opaque", "v": ["nesting", f"deeper than {MAX_DEPTH} levels", None]}
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [to_wire(v, handles, depth + 1) for v in value]
    if isinstance(value, Ref):
        return {"t": "ref", "v": value.name}
    if isinstance(value, Opaque):
        return {"t": "handle", "v": value.handle} if value.handle is not None else {"t": "opaque", "v": [
            value.kind, value.text, None]}
    if isinstance(value, int):  # subclasses (IntEnum, ...) count as their base type's value
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    encoded = _container(value, kind, handles, depth)
    if encoded is not None:
        return encoded
    name = getattr(value, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is value:  # int, str, len: the same everywhere
        return {"t": "builtin", "v": name}
    if handles is not None:
        handles.append(value)
    text = object.__repr__(value)
    return {"t": "opaque", "v": [getattr(kind, "__name__", "?"), text[:200], None if handles is None else len(
        handles) - 1]}


def _container(value: Any, kind: type, handles: list[object] | None, depth: int) -> Wire:
    def each(values: Iterable[object]) -> list[Wire]:
        return [to_wire(v, handles, depth + 1) for v in values]

    for base, tag in _MAPPINGS:
        if isinstance(value, base):
            return {"t": tag, "v": [[to_wire(k, handles, depth + 1), to_wire(v, handles, depth + 1)]
                                    for k, v in value.items()]}
    for base, tag in _SEQUENCES:
        if isinstance(value, base):
            return {"t": tag, "v": each(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"t": "bytearray" if isinstance(value, bytearray) else "bytes", "v": bytes(value).hex()}
    if isinstance(value, complex):
        return {"t": "complex", "v": [value.real, value.imag]}
    decimal, fractions = sys.modules.get("decimal"), sys.modules.get("fractions")  # loaded iff ever used
    if decimal and isinstance(value, decimal.Decimal):
        return {"t": "Decimal", "v": str(value)}
    if fractions and isinstance(value, fractions.Fraction):
        return {"t": "Fraction", "v": [value.numerator, value.denominator]}
    if kind is range:
        return {"t": "range", "v": [value.start, value.stop, value.step]}
    if kind in _VIEWS:
        return {"t": _VIEWS[kind], "v": each(list(v) if kind is type({}.items()) else v for v in value)}
    if hasattr(kind, "__next__"):  # generators, map, zip, itertools...: `list(x)` works, `x == [...]` does not
        items: list[Wire] = []
        for item in value:
            if len(items) >= MAX_ITEMS:
                return {"t": "opaque", "v": [kind.__name__, f"an iterator of more than {MAX_ITEMS} items", None]}
            items.append(to_wire(item, handles, depth + 1))
        return {"t": "iterator", "v": items}
    return None


def _hashable(values: list[T]) -> list[T]:
    """`values`, checked to be keys that build a set or mapping in linear time.

    Keys of one hash (`k * (2**61 - 1)` for ints) cost quadratic time in their number to insert, and the trusted
    side builds them after the reply came, past the sandbox's deadline. Honest data have small groups at most
    (`hash(-1) == hash(-2)`, so `(-1, j)` and `(-2, j)` pair up in a grid's coordinates).
    """
    groups: dict[int, int] = {}
    for v in values:
        try:
            h = hash(v)
        except TypeError:
            raise WireError(f"unhashable {type(v).__name__} in a set or as a key") from None
        groups[h] = groups.get(h, 0) + 1
        if groups[h] > MAX_SHARED_HASHES:
            raise WireError(f"more than {MAX_SHARED_HASHES} of {len(values)} keys share one hash")
    return values


def from_wire(data: Any, resolve: Resolve | None = None, budget: Budget | int | None = None, depth: int = 0) -> Any:
    """Rebuild a value from `to_wire`'s form; only exact built-in (and listed standard) types come out.

    `resolve(tag, value)` turns a `ref`, `handle` or `builtin` into the object (candidate side); elsewhere the
    first two are errors and `builtin` names a built-in type. `budget` (bytes, default REPLY_BUDGET, or a
    `Budget`) bounds the memory the rebuilt value, its ranges expanded, may take: beyond it, a `WireError`.
    """
    if not isinstance(budget, Budget):
        budget = Budget(REPLY_BUDGET if budget is None else budget)
    if depth > MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(data)
    if data is None or kind in (bool, float, str):
        return budget.take(data)
    if kind is int:
        return budget.take(_bounded(data))
    if kind is list:
        return budget.take([from_wire(v, resolve, budget, depth + 1) for v in data])
    if kind is not dict or set(data) != {"t", "v"} or type(data["t"]) is not str:
        raise WireError(f"unexpected {kind.__name__} in a frame")
    tag, v = data["t"], data["v"]

    def items() -> list[Any]:
        if type(v) is not list:
            raise WireError(f"{tag} needs a list")
        return [from_wire(x, resolve, budget, depth + 1) for x in v]

    def pairs() -> dict[Any, Any]:
        if type(v) is not list or any(type(pair) is not list or len(pair) != 2 for pair in v):
            raise WireError(f"{tag} needs [key, value] pairs")
        entries = [(from_wire(key, resolve, budget, depth + 2), from_wire(value, resolve, budget, depth + 2))
                   for key, value in v]
        return dict(zip(_hashable([key for key, _ in entries]), (value for _, value in entries)))

    if tag in ("tuple", "list", "deque"):
        return budget.take({"tuple": tuple, "list": list, "deque": collections.deque}[tag](items()))
    if tag == "iterator":
        return budget.take(iter(budget.take(items())))
    if tag == "set":  # built as a set literal is (from a frozenset), so it iterates in the same order
        return budget.take(set(frozenset(_hashable(items()))))
    if tag == "frozenset":
        return budget.take(frozenset(_hashable(items())))
    if tag in ("dict", "OrderedDict", "Counter"):
        return budget.take({"dict": dict, "OrderedDict": collections.OrderedDict,
                            "Counter": collections.Counter}[tag](pairs()))
    if tag in ("keys", "values", "items"):  # a view, charged the mapping behind it
        if tag == "items":
            mapping = pairs()
        else:
            mapping = dict.fromkeys(_hashable(items())) if tag == "keys" else dict(enumerate(items()))
        return budget.take(getattr(mapping, tag)(), sys.getsizeof(mapping))
    if tag in ("ref", "handle", "builtin") and resolve is not None:
        return resolve(tag, v)  # an object that exists already (candidate side)
    if tag == "opaque" and type(v) is list and len(v) == 3 and type(v[0]) is str and type(v[1]) is str:
        return budget.take(Opaque(v[0][:100], v[1][:200], v[2] if type(v[2]) is int else None))
    return _scalar(tag, v, budget)


def _bounded(number: int) -> int:
    """`number`, if it has at most MAX_INT_DIGITS digits (`unpack` bounds what JSON parses the same way)."""
    if -_INT_BOUND < number < _INT_BOUND:
        return number
    raise WireError(f"an integer of more than {MAX_INT_DIGITS} digits")


def _range(start: int, stop: int, step: int, budget: Budget) -> range:
    """The range, charged what a check's `tuple(...)` or `sorted(...)` of it would build: a pointer and an int
    per item, each int as large as the range's largest in magnitude (computed, never expanded)."""
    span = range(start, stop, step)  # a zero step is a ValueError
    count = max(0, (stop - start + step - (1 if step > 0 else -1)) // step)  # len() fails past sys.maxsize
    largest = max(abs(start), abs(start + (count - 1) * step)) if count else 0
    each = sys.getsizeof(largest) + _POINTER
    number = f"{count:,}" if count < 10**18 else f"about 10**{int(count.bit_length() * 0.30103)}"
    budget.charge(sys.getsizeof(span) + _POINTER + count * each, f"a range of {number} items of {each} bytes each")
    return span


def _scalar(tag: str, v: Any, budget: Budget) -> object:
    try:
        kind = getattr(builtins, v, None) if tag == "builtin" and type(v) is str and not v.startswith("_") else None
        if isinstance(kind, type) and kind.__module__ == "builtins":
            return kind  # exact built-in types only: int, str, ... (no exec or open, no __loader__)
        if tag in ("bytes", "bytearray") and type(v) is str:
            return budget.take((bytes if tag == "bytes" else bytearray).fromhex(v))
        if tag == "complex" and type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
            return budget.take(complex(v[0], v[1]))  # an int part beyond a float's range is an OverflowError
        if tag == "Decimal" and type(v) is str and len(v) <= 1000:
            import decimal

            exact = decimal.Decimal(v)
            if exact.is_finite() and abs(exact.adjusted()) > MAX_DECIMAL_EXPONENT:
                raise WireError(f"a Decimal of exponent {exact.adjusted()}, beyond +-{MAX_DECIMAL_EXPONENT}")
            return budget.take(exact)
        if tag == "Fraction" and type(v) is list and len(v) == 2 and all(type(x) is int for x in v):
            import fractions

            number = fractions.Fraction(_bounded(v[0]), _bounded(v[1]))
            return budget.take(number, sys.getsizeof(number.numerator) + sys.getsizeof(number.denominator))
        if tag == "range" and type(v) is list and len(v) == 3 and all(type(x) is int for x in v):
            start, stop, step = map(_bounded, v)
            return _range(start, stop, step, budget)
    except WireError:
        raise
    except (ValueError, ZeroDivisionError, ArithmeticError) as error:
        raise WireError(f"bad {tag}: {error}") from None
    raise WireError(f"unknown tag {tag[:40]!r}")


def pack(message: object) -> bytes:
    """One frame: a 4-byte big-endian length, then the message as UTF-8 JSON."""
    body = json.dumps(message, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")
    return _HEADER.pack(len(body)) + body


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise WireError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


def unpack(body: bytes) -> Any:
    """The message of one frame's body (trusted side: any failure is a `WireError`)."""
    try:
        return json.loads(body.decode("utf-8", "surrogatepass"), parse_int=_bounded_int)
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise WireError(f"not JSON: {str(error)[:200]}") from None


def header_length(header: bytes) -> int:
    length: int = _HEADER.unpack(header)[0]
    return length

"""Decoding amplification: what the trusted caller builds from a reply is bounded by the memory it costs, not by
item counts. A returned `range(0, 10**4000 * 200000, 10**4000)` is ~50 bytes on the wire and was admitted (200,000
items); a check's `tuple(f())` of it then built 340 MB in the caller. Each test failed before the fix it names:
the reply's byte budget (`codec.Budget`, min(64 MB, memory_mb)) and the checks' int max-str-digits bound.

Every attack is bounded (a few hundred MB at most in the old code) and nothing here times anything: outcomes are
asserted on the status and reason.
"""

from __future__ import annotations

import resource
import sys
import threading
from decimal import Decimal
from fractions import Fraction

import pytest
from sandbox_support import limits, run

from mdmkit.sandbox import Check, codec, run_many, verdict

pytestmark = pytest.mark.usefixtures("allow_code_execution")

HUGE_STEPS = "def f():\n    return range(0, 10**4000 * 200000, 10**4000)\n"  # 200,000 ints of 4,001 digits
MB = 2**20


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def _wire(value):
    """`value` as the trusted side receives it: through to_wire, a frame and unpack."""
    return codec.unpack(codec.pack(codec.to_wire(value))[4:])


# --- ranges ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expand", ["tuple(f())", "list(f())", "sum(f())", "sorted(f())"])
def test_a_check_expanding_a_range_of_huge_steps_is_a_contained_failure(mode, expand):
    before = _peak_rss()
    result = run(mode, Check(HUGE_STEPS, f"assert {expand} == 0\n", ("f",)))
    assert result.status == "failed", result.reason
    assert "range of 200,000 items" in result.reason and "beyond its budget of 64 MB" in result.reason, result.reason
    assert _peak_rss() - before < 200 * MB  # the old code's expansion took ~340 MB here


def test_an_honest_range_still_comes_back_as_a_range(mode):
    candidate = "def f():\n    return range(3)\n\ndef g(n):\n    return range(10**4299, 10**4299 + n)\n"
    tests = ("assert list(f()) == [0, 1, 2]\nassert f() == range(3) and type(f()) is range\n"
             "assert sum(g(1000)) == 1000 * 10**4299 + 499500\n")
    result = run(mode, Check(candidate, tests, ("f", "g")))
    assert result.passed, result.reason


def test_the_reply_budget_is_the_programs_memory_limit_where_that_is_smaller(mode):
    candidate = "def f(n):\n    return range(n)\n"  # 36 bytes an item once expanded: 1.5 M items are 51 MB
    tests = "assert len(f(1_000_000)) == 1_000_000\nassert len(f(1_500_000)) == 1_500_000\n"
    assert run(mode, Check(candidate, tests, ("f",)), memory_mb=256).passed  # 64 MB budget
    result = run(mode, Check(candidate, tests, ("f",)), memory_mb=48)
    assert result.status == "failed" and "beyond its budget of 48 MB" in result.reason, result.reason


def test_ranges_are_charged_their_expanded_size():
    assert codec.from_wire(_wire(range(10**6))) == range(10**6)  # 36 MB expanded: within 64 MB
    assert type(codec.from_wire(_wire(range(10**6)))) is range
    with pytest.raises(codec.WireError, match=r"at least 34\d\.\d MB .*range of 200,000 items.* budget of 64 MB"):
        codec.from_wire(_wire(range(0, 10**4000 * 200000, 10**4000)))
    with pytest.raises(codec.WireError, match=r"range of about 10\*\*4299 items"):  # longer than sys.maxsize
        codec.from_wire({"t": "range", "v": [-10**4299, 10**4299, 1]})
    with pytest.raises(codec.WireError, match="budget of 10 MB"):
        codec.from_wire(_wire(range(10**6)), budget=10 * MB)
    for honest in (range(10, -5, -3), range(5, 0), range(0, -7, -2), range(-10**4299, 10**4299, 10**4298)):
        assert codec.from_wire(_wire(honest), budget=MB) == honest
    with pytest.raises(codec.WireError, match="more than 4300 digits"):
        codec.from_wire({"t": "range", "v": [0, 10**4300, 1]})


# --- nesting --------------------------------------------------------------------------------------------------

NESTED = "def f(n):\n    x = []\n    for _ in range(n):\n        x = [x]\n    return x\n"


def test_deeply_nested_replies_fail_cleanly(mode):
    ok = run(mode, Check(NESTED, "x = []\nfor _ in range(64):\n    x = [x]\nassert f(64) == x\n", ("f",)))
    assert ok.passed, ok.reason
    for depth in (65, 10**5):
        result = run(mode, Check(NESTED, f"assert f({depth}) == 0\n", ("f",)))
        assert result.status == "failed" and "nested deeper than 64 levels" in result.reason, (depth, result.reason)


def test_a_forged_frame_nested_100000_deep_fails_cleanly(mode):
    candidate = (
        "import os, sys\nchild = sys.modules['mdmkit.sandbox.child']\nwrite = child._write\n"
        "def forged(fd, message):\n"
        "    if message.get('ok') == 'loaded':\n        return write(fd, message)\n"
        "    body = b'{\"ok\": ' + b'[' * 100000 + b']' * 100000 + b'}'\n"
        "    data = len(body).to_bytes(4, 'big') + body\n"
        "    while data:\n        data = data[os.write(fd, data):]\n"
        "child._write = forged\ndef f():\n    return 1\n"
    )
    result = run(mode, Check(candidate, "assert f() == 1\n", ("f",)))
    assert result.status == "failed" and "not plain data" in result.reason, result.reason


# --- big numbers, strings and bytes ---------------------------------------------------------------------------

@pytest.fixture
def unbounded_int_parsing():
    """This process with CPython's int max-str-digits bound lifted (PYTHONINTMAXSTRDIGITS=0), restored after."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(previous)


def test_a_long_digit_string_handed_to_int_fails_cleanly_even_without_the_processes_bound(
        mode, unbounded_int_parsing):
    candidate = "def f(n):\n    return '7' * n\n"
    huge, honest = (Check(candidate, f"assert int(f({n})) == 7\n", ("f",)) for n in (10**6, 1))
    results = run_many([huge, honest, huge], limits(mode, max_reply_bytes=2_000_000), workers=2, progress=False)
    for result in (results[0], results[2]):
        assert result.status == "failed" and "Exceeds the limit (4300 digits)" in result.reason, result.reason
    assert results[1].passed, results[1].reason
    assert sys.get_int_max_str_digits() == 0  # the process's own setting once no checks run


@pytest.mark.parametrize("own", [0, 4300, 640, 10**6])
def test_checks_parse_ints_under_the_bound_and_the_last_to_end_restores_it(own):
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(own)
    try:
        inside = min(own or codec.MAX_INT_DIGITS, codec.MAX_INT_DIGITS)
        started, finish = threading.Event(), threading.Event()

        def other_checks():
            with verdict._bounded_int_parsing():
                started.set()
                finish.wait(60)

        with verdict._bounded_int_parsing():
            assert sys.get_int_max_str_digits() == inside
            thread = threading.Thread(target=other_checks)
            thread.start()
            assert started.wait(60)
        assert sys.get_int_max_str_digits() == inside  # the other thread's checks still run
        finish.set()
        thread.join(60)
        assert sys.get_int_max_str_digits() == own
    finally:
        sys.set_int_max_str_digits(previous)


def test_fractions_and_complex_numbers_are_bounded():
    big = Fraction(10**4300 - 1, 10**4299 + 7)  # 4,300 digits over 4,300 digits: at the bound
    assert codec.from_wire(_wire(big)) == big
    for parts in ([10**4300, 3], [3, -10**4300]):  # 4,301 digits
        with pytest.raises(codec.WireError, match="more than 4300 digits"):
            codec.from_wire({"t": "Fraction", "v": parts})
    with pytest.raises(codec.WireError, match="more than 4300 digits"):
        codec.unpack(b'{"t": "Fraction", "v": [1' + b"0" * 4300 + b", 3]}")
    for value in (complex(1e308, -1e308), complex(float("inf"), 0.5)):
        assert codec.from_wire(_wire(value)) == value
    for parts in ([10**400, 0], [0, -(10**4299)]):  # floats bound a complex: an int part beyond them is refused
        with pytest.raises(codec.WireError, match="bad complex"):
            codec.from_wire({"t": "complex", "v": parts})
    with pytest.raises(codec.WireError, match="beyond its budget"):  # its numerator alone is 1.9 kB
        codec.from_wire({"t": "Fraction", "v": [10**4299, 3]}, budget=1_000)


def test_many_medium_values_are_charged_in_sum():
    """No single value is large; together they pass a small budget. Under it, the same values come back."""
    budget = 100_000
    cases = {
        "ints": [10**4000 + i for i in range(100)],  # ~1.8 kB each: 180 kB
        "strings": ["x" * 1000 + str(i) for i in range(200)],  # ~1 kB each: 210 kB
        "bytes": [bytes(1000) + bytes([i]) for i in range(200)],
        "nested lists": [[[i]] for i in range(2000)],  # three small objects each: ~300 kB
        "a dict": {i: str(i) for i in range(2000)},
        "Decimals": [Decimal("1." + "1" * 990)] * 400,  # ~0.5 kB each
    }
    for name, value in cases.items():
        with pytest.raises(codec.WireError, match="beyond its budget of 100,000 bytes per reply"):
            codec.from_wire(_wire(value), budget=budget)
        assert codec.from_wire(_wire(value), budget=10 * budget) == value, name
    shared = codec.Budget(budget)  # one budget across calls: spent by the sum
    codec.from_wire(_wire(cases["ints"][:40]), budget=shared)
    with pytest.raises(codec.WireError, match="beyond its budget"):
        codec.from_wire(_wire(cases["ints"][:40]), None, shared)  # third positional: the budget


def test_the_candidate_side_calls_keep_working():
    """child.py calls `from_wire(args, resolve)`: its own default budget, resolved objects charged nothing."""
    calls = []

    def resolve(tag, value):
        calls.append((tag, value))
        return object

    assert codec.from_wire([1, {"t": "ref", "v": "x"}, {"t": "tuple", "v": ["a"]}], resolve) == [1, object, ("a",)]
    assert calls == [("ref", "x")]
    with pytest.raises(codec.WireError, match="budget of 64 MB"):  # the default: REPLY_BUDGET
        codec.from_wire({"t": "range", "v": [0, 10**8, 1]}, resolve)

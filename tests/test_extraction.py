"""Answer/code extraction: hand cases plus whole-benchmark checks on the gold GSM8K and HumanEval solutions."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import BENCHMARK_DATA

from mdmkit.tasks.extraction import (
    STOP_PHRASES,
    extract_code,
    extract_gsm8k_answer,
    gsm8k_correct,
    humaneval_program,
    mbpp_program,
    normalize_number,
    truncate_at_stop,
)

DATA = BENCHMARK_DATA


def _jsonl(name: str) -> list[dict]:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"benchmark data not found at {path}")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def gsm8k() -> list[dict]:
    return _jsonl("gsm8k_test.jsonl")


@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    return _jsonl("HumanEval.jsonl.gz")


# ---------------------------------------------------------------- numbers / GSM8K


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234", "1234"),
        ("$5.00", "5"),
        ("3.50", "3.5"),
        ("4.0", "4"),
        (" -7 ", "-7"),
        ("+12", "12"),
        ("-0.0", "0"),
        ("18.", "18"),
        (".5", "0.5"),
        ("$1,450,000.", "1450000"),
        ("abc", None),
        ("", None),
        ("1.2.3", None),
    ],
)
def test_normalize_number(text: str, expected: str | None) -> None:
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the total is 1,234 apples", "1234"),
        ("She lost 3 and is at -5", "-5"),
        ("It costs $5.00.", "5"),
        ("Each is 2.50 dollars", "2.5"),
        ("The answer is 18.\n\nQuestion: Tom has 3 cats and 42 dogs.", "18"),
        ("the answer is: $1,600.", "1600"),
        ("The answer is -10.", "-10"),
        ("We get 12 - 4 = 8 left", "8"),  # a spaced minus is subtraction, not a sign
        ("Work: <<3*4=12>>12\n#### 12\nThe answer is 7.", "12"),
        ("I cannot tell.", None),
    ],
)
def test_extract_gsm8k_answer(text: str, expected: str | None) -> None:
    assert extract_gsm8k_answer(text) == expected


def test_gsm8k_correct() -> None:
    gold = "She has 5 + 3 = <<5+3=8>>8.\n#### 8"
    assert gsm8k_correct("5 + 3 = 8. The answer is 8.\n\nQuestion: 9 birds", gold)
    assert not gsm8k_correct("The answer is 9.", gold)
    assert not gsm8k_correct("no idea", gold)


def _gold(answer: str) -> tuple[str, str | None]:
    solution, _, number = answer.rpartition("####")
    return solution.rstrip(), normalize_number(number)


def test_gsm8k_gold_solutions_all(gsm8k: list[dict]) -> None:
    assert len(gsm8k) == 1319
    for row in gsm8k:
        solution, expected = _gold(row["answer"])
        assert expected is not None
        assert extract_gsm8k_answer(row["answer"]) == expected
        number = row["answer"].rpartition("####")[2].strip()
        # Few-shot answer format, followed by junk that would win under a last-number rule.
        rewritten = solution + f" The answer is {number}.\n\nQuestion: A farmer has 17 cows and 3 barns."
        assert extract_gsm8k_answer(rewritten) == expected, rewritten
        assert gsm8k_correct(rewritten, row["answer"])
        # No marker at all: last-number fallback, past calculator annotations and comma-grouped numbers.
        assert extract_gsm8k_answer(solution + f"\nSo in total it is {number}") == expected


# ---------------------------------------------------------------- stop phrases


def test_stop_phrases_table() -> None:
    assert set(STOP_PHRASES) == {"llada", "dream"}
    for model in STOP_PHRASES.values():
        assert {"humaneval", "mbpp", "gsm8k"} <= set(model)
        assert model["mbpp"] == ["[DONE]"] and model["gsm8k"] == ["The answer is %d."]
    assert STOP_PHRASES["llada"]["humaneval"] == ["<|endoftext|>", "\n\n\n"]
    assert STOP_PHRASES["dream"]["humaneval"] == ["<|endoftext|>", "```\n"]


def test_truncate_at_stop() -> None:
    assert truncate_at_stop("abc\n\n\nxyz<|endoftext|>", ["<|endoftext|>", "\n\n\n"]) == "abc"
    assert truncate_at_stop("no stop here", ["[DONE]"]) == "no stop here"
    assert truncate_at_stop("code\n[DONE]\n[BEGIN] more", ["[DONE]"]) == "code\n"
    gsm = "3 + 4 = 7. The answer is 7.\n\nQuestion: 5 more"
    assert truncate_at_stop(gsm, STOP_PHRASES["llada"]["gsm8k"]) == "3 + 4 = 7. The answer is 7."
    assert truncate_at_stop("The answer is 1,600. Next", ["The answer is %d."]) == "The answer is 1,600."
    dream = "```python\ndef f():\n    return 1\n```\nThis works."
    cut = truncate_at_stop(dream, STOP_PHRASES["dream"]["humaneval"])
    assert cut == "```python\ndef f():\n    return 1\n"
    assert extract_code(cut, entry_point="f") == "def f():\n    return 1\n"  # unclosed fence still extracts


# ---------------------------------------------------------------- code extraction

PROMPT = 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum xs."""\n'
BODY = "    return sum(xs)\n"
FULL = "def add(xs: List[int]) -> int:\n    return sum(xs)\n"
TEST = "def check(candidate):\n    assert candidate([1, 2]) == 3\n"


def test_extract_code_fences() -> None:
    assert extract_code(f"Sure!\n```python\n{FULL}```\nDone.") == FULL
    assert extract_code(f"Sure!\n```\n{FULL}```\n") == FULL
    helper = "def helper():\n    return 0\n"
    two = f"First:\n```python\n{helper}```\nThen:\n```python\n{FULL}```"
    assert extract_code(two, entry_point="add") == FULL
    assert extract_code(two) == helper  # no entry point: first block
    assert extract_code(two, entry_point="missing") == helper


def test_extract_code_mbpp_markers() -> None:
    code = "def sq(x):\n    return x * x"
    assert extract_code(f"[BEGIN]\n{code}\n[DONE]\n[BEGIN] junk").strip() == code
    assert extract_code(f"\n{code}\n[DONE] more tasks").strip() == code  # prompt ended with [BEGIN]
    assert extract_code(f"[BEGIN]\n```python\n{code}\n```\n[DONE]").strip() == code


def test_extract_code_prompt_repetition_and_bare_completion() -> None:
    assert extract_code(PROMPT + BODY, prompt=PROMPT) == BODY
    assert extract_code(f"```python\n{PROMPT}{BODY}```", prompt=PROMPT, entry_point="add") == BODY
    assert extract_code("\n" + PROMPT.rstrip() + "\n" + BODY, prompt=PROMPT) == BODY
    assert extract_code(BODY, prompt=PROMPT, entry_point="add") == BODY  # indentation preserved


def test_humaneval_program_variants() -> None:
    harness = "\n" + TEST + "\ncheck(add)\n"
    assert humaneval_program(PROMPT, BODY, "add", TEST) == PROMPT + BODY + harness
    full = humaneval_program(PROMPT, FULL, "add", TEST)
    assert full == "from typing import List\n\n\n" + FULL + harness  # imports kept, prompt def replaced
    namespace: dict = {}
    exec(compile(full, "<humaneval>", "exec"), namespace)  # noqa: S102 - tiny program written above


def test_mbpp_program() -> None:
    program = mbpp_program("class Node:\n    pass", ["assert Node() is not None"], "root = Node()")
    assert program == "class Node:\n    pass\nroot = Node()\nassert Node() is not None\n"
    assert mbpp_program("x = 1", ["assert x == 1", "assert x > 0"]) == "x = 1\nassert x == 1\nassert x > 0\n"
    namespace: dict = {}
    exec(compile(program, "<mbpp>", "exec"), namespace)  # noqa: S102 - tiny program written above


def test_humaneval_canonical_structural(humaneval: list[dict]) -> None:
    assert len(humaneval) == 164
    for p in humaneval:
        completion = extract_code(p["canonical_solution"], prompt=p["prompt"], entry_point=p["entry_point"])
        program = humaneval_program(p["prompt"], completion, p["entry_point"], p["test"])
        harness = "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"
        expected = p["prompt"] + p["canonical_solution"] + harness
        assert program == expected, p["task_id"]


def test_humaneval_fenced_full_function(humaneval: list[dict]) -> None:
    for p in humaneval:
        entry = p["entry_point"]
        generation = (
            "Here is the completed function:\n```python\n"
            + p["prompt"]
            + p["canonical_solution"]
            + "```\nThis handles the edge cases.\n```python\nprint('example usage')\n```\n"
        )
        completion = extract_code(generation, prompt=p["prompt"], entry_point=entry)
        program = humaneval_program(p["prompt"], completion, entry, p["test"])
        code = compile(program, p["task_id"], "exec")
        assert entry in code.co_names or entry in code.co_varnames, p["task_id"]
        assert re.search(rf"^def {re.escape(entry)}\s*\(", program, re.MULTILINE), p["task_id"]
        assert "```" not in program and "This handles" not in program, p["task_id"]


def test_humaneval_fenced_function_without_header(humaneval: list[dict]) -> None:
    """A block restating only the function (imports dropped) takes the full-function path and keeps the imports."""
    for p in humaneval:
        entry = p["entry_point"]
        start = re.search(rf"^def {re.escape(entry)}\s*\(", p["prompt"], re.MULTILINE).start()
        function = p["prompt"][start:] + p["canonical_solution"]
        completion = extract_code(f"```\n{function}```", prompt=p["prompt"], entry_point=entry)
        if p["prompt"][:start].strip():  # with nothing before the def, it is just a prompt repetition
            assert completion == function, p["task_id"]
        program = humaneval_program(p["prompt"], completion, entry, p["test"])
        assert program.startswith(p["prompt"][:start] + function), p["task_id"]
        assert entry in compile(program, p["task_id"], "exec").co_names, p["task_id"]


def test_mbpp_reference_code_through_markers() -> None:
    """Every MBPP reference solution survives the [BEGIN]/[DONE] framing and yields a compilable program."""
    rows = _jsonl("mbpp.jsonl")
    assert len(rows) == 974
    for row in rows:
        generation = f"\n{row['code']}\n[DONE]\n\nYou are an expert Python programmer ... [BEGIN]\nx = ("
        code = extract_code(generation)
        assert code.strip() == row["code"].strip(), row["task_id"]
        program = mbpp_program(code, row["test_list"], row["test_setup_code"])
        compile(program, f"mbpp/{row['task_id']}", "exec")

"""Answer and code extraction for GSM8K, HumanEval and MBPP generations.

Masked diffusion models emit a fixed-length canvas, so a raw generation usually carries junk after the answer
(repeated few-shot questions, extra functions, chat chatter). These pure functions turn such text into what the
benchmark scores: a canonical number for GSM8K, an executable program for HumanEval/MBPP. They never execute code.
For scoring, `humaneval_check` / `mbpp_check` split a program into the candidate's part, which runs in the
sandbox, and the dataset's checks, which run in the trusted caller (see `mdmkit.sandbox.verdict`).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from mdmkit.core.stopping import find_stop
from mdmkit.sandbox import Check

# Stop ("generate_until") phrases from the EB-Sampler paper, Appendix C, Table 2. MBPP, GSM8K and MATH list a single
# phrase spanning both model columns, so both models share it. Reconstruction notes (the text extraction of the
# table replaced quotes with typographic ones and mangled backticks):
#   * Dream/HumanEval reads `”“‘\n”` in the extracted text; LaTeX renders ``` `` ` ``` as `“‘`, so this is the
#     closing code fence "```\n" (Dream wraps its answer in a fenced block).
#   * GSM8K's "The answer is %d." is a template, not a literal: `truncate_at_stop` matches "%d" against a number
#     and keeps the matched phrase, since it carries the answer.
_SHARED_STOPS = {"mbpp": ["[DONE]"], "gsm8k": ["The answer is %d."], "math": ["I hope it is correct."]}
STOP_PHRASES: dict[str, dict[str, list[str]]] = {
    "llada": {"humaneval": ["<|endoftext|>", "\n\n\n"], **_SHARED_STOPS},
    "dream": {"humaneval": ["<|endoftext|>", "```\n"], **_SHARED_STOPS},
}

# A number as written in prose: optional sign and "$", thousands groups or plain digits, optional decimals.
# The sign must not follow a word character, so "5-3" yields 5 and 3 rather than 5 and -3.
_NUMBER = r"(?:(?<![\w.])-)?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_HASH_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_ANSWER_IS_RE = re.compile(r"the answer is:?\s*(-?\s?\$?\s?-?[\d,]*\d(?:\.\d+)?)", re.IGNORECASE)
_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def normalize_number(text: str) -> str | None:
    """Canonical string for a numeric answer ("$1,234.50" -> "1234.5", "4.0" -> "4"), or None if not a number.

    Gold and predicted answers are compared as strings, so formatting differences must not count as errors.
    """
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not re.fullmatch(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", s):
        return None
    try:
        value = Decimal(s)
    except InvalidOperation:  # pragma: no cover - the regex already guarantees a valid literal
        return None
    if value == value.to_integral_value():
        return str(int(value))  # also maps "-0" to "0"
    return format(value.normalize(), "f")


def extract_gsm8k_answer(text: str) -> str | None:
    """The normalized final answer of a GSM8K solution or generation, or None if it contains no number.

    Preference: "#### N" (gold format), then the first "The answer is N" (the few-shot answer format, which is
    also the stop phrase: text after it is junk), then the last number anywhere (models that skip the format).
    """
    for pattern in (_HASH_RE, _ANSWER_IS_RE):
        match = pattern.search(text)
        if match and (value := normalize_number(match.group(1))) is not None:
            return value
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def gsm8k_correct(generation: str, gold_answer_field: str) -> bool:
    """Whether a generation's answer equals the gold solution's "#### N" answer (numerically normalized)."""
    predicted = extract_gsm8k_answer(generation)
    return predicted is not None and predicted == extract_gsm8k_answer(gold_answer_field)


def truncate_at_stop(text: str, stops: Sequence[str]) -> str:
    """Cut text at the earliest stop phrase, mimicking generate_until on a fixed-length canvas.

    A literal stop is removed together with everything after it. A template stop containing "%d" (GSM8K's
    "The answer is %d.") is kept, because the matched phrase is the answer itself; only what follows is cut.
    """
    cut = find_stop(text, stops)
    return text if cut is None else text[:cut]


def _defines(code: str, entry_point: str) -> re.Match[str] | None:
    return re.search(rf"^[ \t]*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE)


def extract_code(generation: str, prompt: str | None = None, entry_point: str | None = None) -> str:
    """The code in a generation, ready to append to (or replace) the prompt.

    Handles, in order: MBPP's "[BEGIN] ... [DONE]" markers (either may be missing, since the prompt usually ends
    with "[BEGIN]" and the stop phrase removes "[DONE]"); fenced blocks, preferring the one that defines
    `entry_point` (an unclosed final fence counts, as the "```\\n" stop phrase removes the closing fence); and a
    leading repetition of the prompt. Text without markers or fences is returned unchanged, since a bare
    completion's leading indentation is significant.
    """
    code = generation
    begin, done = code.find("[BEGIN]"), code.find("[DONE]")
    if begin != -1 and (done == -1 or begin < done):  # a [BEGIN] after [DONE] opens the next (junk) task
        code = code[begin + len("[BEGIN]") :]
    if "[DONE]" in code:
        code = code.split("[DONE]", 1)[0]
    if blocks := _FENCE_RE.findall(code):
        code = next((b for b in blocks if entry_point and _defines(b, entry_point)), blocks[0])
    if prompt and prompt.strip():
        if code.startswith(prompt):
            code = code[len(prompt) :]
        elif code.lstrip().startswith(prompt.strip()):  # repetition with different surrounding whitespace
            code = code.lstrip()[len(prompt.strip()) :]
            tail = prompt[len(prompt.rstrip()) :]  # the prompt's trailing newline(s), which the body follows
            code = code.removeprefix(tail)
    return code


def _humaneval_harness(test: str, entry_point: str) -> str:
    """The check harness appended after the solution, as in the official HumanEval evaluation."""
    return f"\n{test}\ncheck({entry_point})\n"


def _humaneval_parts(prompt: str, completion: str, entry_point: str) -> tuple[str, str]:
    """(the prompt before its own `def entry_point`, the full solution).

    A completion that defines `entry_point` itself is used as the full function, keeping that part of the prompt
    (imports, helper functions); otherwise it is a body continuing the prompt. This is the EB paper's
    Appendix C.1.3 fix for Dream, which often restates the whole function.
    """
    header_match = _defines(prompt, entry_point)
    header = prompt[: header_match.start()] if header_match else ""
    return header, (header + completion if _defines(completion, entry_point) else prompt + completion)


def humaneval_program(prompt: str, completion: str, entry_point: str, test: str) -> str:
    """A runnable HumanEval program from an (already extracted) completion: solution, then the check harness."""
    return _humaneval_parts(prompt, completion, entry_point)[1] + _humaneval_harness(test, entry_point)


def humaneval_check(prompt: str, completion: str, entry_point: str, test: str) -> Check:
    """The same program for the sandbox: the solution runs there; `check(entry_point)` runs in the caller, with
    the prompt's helpers (e.g. `poly` for HumanEval/32) from the dataset, not from the candidate."""
    header, solution = _humaneval_parts(prompt, completion, entry_point)
    harness = _humaneval_harness(test, entry_point)
    return Check(solution=solution, tests=harness, remote=(entry_point,), prelude=header)


def mbpp_program(code: str, test_list: Sequence[str], test_setup_code: str = "") -> str:
    """A runnable MBPP program: solution, then setup (which may use the solution's classes), then the asserts."""
    parts = [code, test_setup_code, *test_list]
    return "\n".join(p for p in parts if p) + "\n"


def mbpp_check(
    code: str, test_list: Sequence[str], test_setup_code: str = "", reference: str | None = None
) -> Check:
    """The same program for the sandbox: solution and setup run there, the asserts in the caller.

    The asserts reach into the sandbox for the names the reference solution defines or the setup assigns
    (task 126 defines `sum`, which the asserts call); every other name, built-ins included, stays the caller's.
    Without a parseable reference, every name the asserts use that is not a built-in is the candidate's.
    """
    tests = "\n".join(test_list) + "\n"
    used = _names(tests, ast.Load)
    provided = _names(test_setup_code, ast.Store)
    reference_names = _top_level_names(reference) if reference else None
    provided |= used - set(vars(builtins)) if reference_names is None else reference_names
    return Check(solution=code, tests=tests, remote=tuple(sorted(used & provided)), setup=test_setup_code)


def _names(source: str, context: type) -> set[str]:
    """Names `source` loads (ast.Load) or assigns (ast.Store); none if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, context)}


def _top_level_names(source: str) -> set[str] | None:
    """What a module binds at its top level (functions, classes, assignments, imports); None if unparseable."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:
            bound.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return bound

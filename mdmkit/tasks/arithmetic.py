"""Synthetic multi-step arithmetic with a chain of thought: a reasoning task a small model learns on a CPU.

A problem is `n_ops` operators between non-negative integer operands, e.g. `3+4*2`. Each example is one
character per token:

    3+4*2:3+4=7,7*2=14#14$$$$$$$$

the problem, the separator `:`, then the answer region: the chain of thought (one `a op b=r` step per
operator, comma separated), `#`, the final answer and `$`, which both ends the answer and pads the sequence
to `seq_len`. The padding belongs to the answer region, so a model also learns where its answer stops.

`order` fixes how a problem is read: `left` evaluates strictly left to right (`3+4*2` is 14, each step
reuses the previous result, the easier task), `precedence` evaluates `*` before `+`/`-` as Python does
(`3+4*2` is 11; the steps do the leftmost `*` first, then the rest left to right). Only the final answer is
scored, so a model may reason differently, or wrongly, and still be right.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from mdmkit.core.config import require
from mdmkit.core.errors import DataFormatError
from mdmkit.core.stopping import StopCondition
from mdmkit.tasks.base import Examples, PuzzleTask, digest

SEP, STEP, ANSWER, END = ":", ",", "#", "$"
VOCAB = (*"0123456789", "+", "-", "*", "=", SEP, STEP, ANSWER, END, "[MASK]")
OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_ANSWER = re.compile(r"0|-?[1-9][0-9]*")
_PROBLEM = re.compile(r"[0-9]+(?:[-+*][0-9]+)*")
_LINE = re.compile(r"(?P<problem>[^=]*)(?:=(?P<answer>.*))?")

Interval = tuple[int, int]
Problem = tuple[tuple[int, ...], str]  # (operands, operators): operands[i] ops[i] operands[i + 1] ...


def solve(operands: tuple[int, ...], ops: str, order: str) -> tuple[list[str], int]:
    """The chain of thought (`a op b=r` per operator) and the value of `operands` joined by `ops`."""
    values, pending, steps = list(operands), list(ops), []
    while pending:
        at = pending.index("*") if order == "precedence" and "*" in pending else 0
        a, op, b = values[at], pending.pop(at), values[at + 1]
        values[at : at + 2] = [OPERATIONS[op](a, b)]
        steps.append(f"{a}{op}{b}={values[at]}")
    return steps, values[0]


def problem_key(operands: tuple[int, ...], ops: str) -> bytes:
    """A digest of the problem itself (not of its token sequence), which is what splits must not share."""
    return digest(np.asarray(operands, dtype=np.int64).tobytes(), ops.encode())


def _apply(op: str, a: Interval, b: Interval) -> Interval:
    """Interval arithmetic: the range of `x op y` for x in a, y in b."""
    if op == "*":
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    return (a[0] + b[0], a[1] + b[1]) if op == "+" else (a[0] - b[1], a[1] - b[0])


def _hull(ranges: list[Interval]) -> Interval:
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _width(interval: Interval) -> int:
    """The most characters a number in the interval takes (sign included)."""
    return max(len(str(interval[0])), len(str(interval[1])))


@dataclass
class ArithmeticTask(PuzzleTask):
    """`n_ops` operators from `operators` between operands drawn uniformly from `operand_range` (inclusive)."""

    name = "arithmetic"

    n_ops: int = 3  # operators per problem (1..8): the number of reasoning steps
    operand_range: tuple[int, int] = (0, 9)  # inclusive range of the operands (0 <= lo <= hi <= 999)
    operators: str = "+-*"  # any distinct subset of + - * (quote it: * is special in YAML)
    # left: strictly left to right (easier); precedence: * before + and -, as in Python
    order: Literal["left", "precedence"] = "left"
    cot: bool = True  # false: the answer region is only `#answer$` (an ablation without reasoning steps)

    def validate(self) -> None:
        super().validate()
        require(1 <= self.n_ops <= 8, f"n_ops={self.n_ops} must lie in [1, 8]")
        lo, hi = self.operand_range
        require(0 <= lo <= hi <= 999, f"operand_range={list(self.operand_range)} must satisfy 0 <= lo <= hi <= 999")
        require(
            len(self.operators) >= 1 and set(self.operators) <= set(OPERATIONS)
            and len(set(self.operators)) == len(self.operators),
            f"operators={self.operators!r} must be distinct characters from '+-*'",
        )
        total = self.n_train + self.n_val + self.n_test
        require(
            2 * total <= self.space_size,
            f"{total} examples need at least {2 * total} distinct problems, but n_ops={self.n_ops}, "
            f"operand_range={list(self.operand_range)}, operators={self.operators!r} give only {self.space_size}",
        )

    @property
    def space_size(self) -> int:
        """How many distinct problems the settings allow."""
        lo, hi = self.operand_range
        return (hi - lo + 1) ** (self.n_ops + 1) * len(self.operators) ** self.n_ops

    @property
    def vocab(self) -> tuple[str, ...]:
        return VOCAB  # the same for every difficulty

    @property
    def seq_len(self) -> int:
        """A tight upper bound on problem + separator + answer region, from interval bounds on every value."""
        prompt = (self.n_ops + 1) * len(str(self.operand_range[1])) + self.n_ops
        marks = self.n_ops if self.cot else 1  # ',' after each step but the last, then '#' (alone without steps)
        longest = max(
            (sum(_width(a) + _width(b) + _width(r) + 2 for a, b, r in steps) if self.cot else 0) + _width(value)
            for steps, value in self._shapes()
        )
        return prompt + 1 + longest + marks + 1  # problem, ':', steps, marks, answer, '$'

    def _shapes(self) -> Iterator[tuple[list[tuple[Interval, Interval, Interval]], Interval]]:
        """Each way evaluation can go, as the ranges of (left, right, result) of its steps and of the answer.

        `left` has one shape; `precedence` has one per split of the operands into runs joined by `*`.
        """
        operand = self.operand_range
        if self.order == "left":
            steps, value = [], operand
            for _ in range(self.n_ops):
                after = _hull([_apply(op, value, operand) for op in self.operators])
                steps.append((value, operand, after))
                value = after
            yield steps, value
            return
        products = [operand]  # products[j]: the range of a product of j + 1 operands
        for _ in range(self.n_ops):
            products.append(_apply("*", products[-1], operand))
        additive = [op for op in self.operators if op != "*"]
        gap_kinds = (["*"] if "*" in self.operators else []) + (["+"] if additive else [])
        for gaps in itertools.product(gap_kinds, repeat=self.n_ops):
            runs = [len(run) + 1 for run in "".join(gaps).split("+")]
            steps = [(products[j], operand, products[j + 1]) for m in runs for j in range(m - 1)]
            value = products[runs[0] - 1]
            for m in runs[1:]:
                after = _hull([_apply(op, value, products[m - 1]) for op in additive])
                steps.append((value, products[m - 1], after))
                value = after
            yield steps, value

    def settings(self) -> dict:
        return {"n_ops": self.n_ops, "operand_range": list(self.operand_range), "operators": self.operators,
                "order": self.order, "cot": self.cot}

    def decode(self, tokens: torch.Tensor | np.ndarray) -> str:
        """The sequence as text, e.g. `3+4*2:3+4=7,7*2=14#14$$$` (masked positions show as [MASK])."""
        return "".join(self.vocab[int(t)] for t in tokens)

    def text(self, operands: tuple[int, ...], ops: str) -> str:
        """The full example text before padding: problem, separator, chain of thought, answer, end."""
        steps, value = solve(operands, ops, self.order)
        problem = "".join(f"{a}{op}" for a, op in zip(operands, ops)) + str(operands[-1])
        return f"{problem}{SEP}{STEP.join(steps) if self.cot else ''}{ANSWER}{value}{END}"

    def _examples(self, problems: list[Problem]) -> Examples:
        length = self.seq_len
        texts = [self.text(operands, ops) for operands, ops in problems]
        if max(map(len, texts)) > length:  # cannot happen for operands in range: seq_len is an upper bound
            raise AssertionError(f"an arithmetic example exceeds seq_len={length}")
        table = np.zeros(256, dtype=np.int64)
        table[[ord(ch) for ch in VOCAB[:-1]]] = np.arange(len(VOCAB) - 1)
        raw = np.frombuffer("".join(t.ljust(length, END) for t in texts).encode("ascii"), dtype=np.uint8)
        tokens = table[raw].reshape(len(texts), length)
        separator = np.array([t.index(SEP) for t in texts])
        answer_mask = np.arange(length)[None, :] > separator[:, None]
        keys = np.array([problem_key(*p) for p in problems], dtype="S20")
        return Examples(tokens, answer_mask, keys)

    def generate(self, count: int, seed: int) -> Examples:
        """`count` distinct problems, drawn uniformly (so `_generate_unique` rarely needs a second round)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.operand_range
        problems: list[Problem] = []
        seen: set[bytes] = set()
        for _ in range(64):
            need = count - len(problems)
            if need <= 0:
                break
            operands = rng.integers(lo, hi + 1, size=(need, self.n_ops + 1)).tolist()
            choices = rng.integers(0, len(self.operators), size=(need, self.n_ops)).tolist()
            for values, picks in zip(operands, choices):
                problem = (tuple(values), "".join(self.operators[i] for i in picks))
                key = problem_key(*problem)
                if key not in seen:
                    seen.add(key)
                    problems.append(problem)
        require(len(problems) == count, f"arithmetic: cannot draw {count} distinct problems from {self.space_size}")
        return self._examples(problems)

    def read_file(self, path: Path) -> Examples:
        """One problem per line, e.g. `3+4*2`, optionally with its answer to check (`3+4*2=14`).

        Spaces are ignored and blank lines and lines starting with '#' are skipped. A problem must have
        exactly `n_ops` operators from `operators` and operands in `operand_range`, so it fits `seq_len`.
        """
        problems: list[Problem] = []
        lo, hi = self.operand_range
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            text = "".join(line.split())
            if not text or text.startswith("#"):
                continue
            where = f"{path}:{number}"
            match = _LINE.fullmatch(text)
            if match is None or not _PROBLEM.fullmatch(match["problem"]):
                raise DataFormatError(f"{where}: expected a problem like 3+4*2 (optionally =answer), got {line!r}")
            ops = "".join(re.findall(r"[-+*]", match["problem"]))
            operands = tuple(int(v) for v in re.split(r"[-+*]", match["problem"]))
            if len(ops) != self.n_ops:
                raise DataFormatError(f"{where}: expected {self.n_ops} operators, got {len(ops)}")
            if not set(ops) <= set(self.operators):
                raise DataFormatError(f"{where}: operators {ops!r} are not all in operators={self.operators!r}")
            if not all(lo <= v <= hi for v in operands):
                raise DataFormatError(f"{where}: operands must lie in operand_range [{lo}, {hi}]")
            if match["answer"] is not None:
                value = solve(operands, ops, self.order)[1]
                if not _ANSWER.fullmatch(match["answer"]) or int(match["answer"]) != value:
                    raise DataFormatError(
                        f"{where}: stated answer {match['answer']!r} is not {value} (order={self.order})"
                    )
            problems.append((operands, ops))
        if not problems:
            raise DataFormatError(f"{path}: no problems found")
        return self._examples(problems)

    def final_answer(self, tokens: torch.Tensor | np.ndarray) -> int | None:
        """The integer between the last `#` and the first `$` of an answer region; None if malformed."""
        ids = np.asarray(tokens).astype(np.int64)
        ids = np.where((ids >= 0) & (ids < len(VOCAB)), ids, len(VOCAB) - 1)
        text = "".join(VOCAB[i] if len(VOCAB[i]) == 1 else "?" for i in ids.tolist())
        end = text.find(END)
        if end < 0 or ANSWER not in text[:end]:
            return None
        answer = text[:end].rpartition(ANSWER)[2]
        return int(answer) if _ANSWER.fullmatch(answer) else None

    def stop_condition(self) -> StopCondition:
        """The answer ends at the first end token: decoding may stop once it and everything before are set."""
        return StopCondition.of([VOCAB.index(END)])

    def score(self, predicted: torch.Tensor, target: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """Accuracy on the final answer: the chain of thought is not checked; malformed answers are wrong."""
        pred, gold, mask = (t.detach().cpu().numpy() for t in (predicted, target, answer_mask))
        correct = []
        for p, g, m in zip(pred, gold, mask):
            value = self.final_answer(p[m])
            correct.append(value is not None and value == self.final_answer(g[m]))
        return torch.tensor(correct, dtype=torch.bool, device=predicted.device)


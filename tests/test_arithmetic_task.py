"""The arithmetic task: correct chains of thought, answer-only scoring, disjoint splits, configs, files."""

from __future__ import annotations

import operator
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, compose_config

from mdmkit.core.config import build
from mdmkit.core.errors import ConfigError, DataFormatError
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.tasks.arithmetic import ArithmeticTask
from mdmkit.tasks.base import Split

STEP = re.compile(r"(-?\d+)([-+*])(\d+)=(-?\d+)")
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def task(tmp_path: Path, **kwargs) -> ArithmeticTask:
    return ArithmeticTask(**{"n_train": 200, "n_val": 30, "n_test": 30, "cache_dir": str(tmp_path), **kwargs})


def python_value(problem: str, order: str) -> int:
    """The problem's value by Python itself: as written (precedence), or bracketed left to right."""
    if order == "precedence":
        return eval(problem)
    parts = re.split(r"([-+*])", problem)
    text = parts[0]
    for op, operand in zip(parts[1::2], parts[2::2]):
        text = f"({text}){op}{operand}"
    return eval(text)


def tokens_of(t: ArithmeticTask, text: str) -> torch.Tensor:
    return torch.tensor([t.vocab.index(ch) for ch in text.ljust(t.seq_len, "$")])


@pytest.mark.parametrize("settings", [{}, {"order": "precedence"}, {"n_ops": 4, "operand_range": [5, 30]},
                                      {"operators": "-", "n_ops": 5, "order": "precedence"}])
def test_chain_of_thought_is_correct_and_ends_in_pythons_answer(tmp_path: Path, settings: dict) -> None:
    t = task(tmp_path, **settings)
    examples = t.generate(300, seed=1)
    assert examples.tokens.shape == (300, t.seq_len)
    for row, mask in zip(examples.tokens, examples.answer_mask):
        text = t.decode(row)
        problem, answer_region = text.split(":")
        assert t.decode(row[mask]) == answer_region  # the answer region is everything after ':', padding included
        body, end = answer_region.split("$", 1)
        assert set(end) <= {"$"}
        chain, final = body.split("#")
        steps = chain.split(",")
        assert len(steps) == t.n_ops
        for step in steps:
            a, op, b, result = STEP.fullmatch(step).groups()
            assert OPS[op](int(a), int(b)) == int(result)
        assert int(final) == int(steps[-1].split("=")[1]) == python_value(problem, t.order)
        lo, hi = t.operand_range
        assert all(lo <= int(v) <= hi for v in re.split(r"[-+*]", problem))


def test_default_config_is_short_and_bounds_are_tight(tmp_path: Path) -> None:
    t = task(tmp_path)
    assert t.seq_len <= 64 and t.vocab_size == 19 and t.vocab[t.mask_id] == "[MASK]"
    assert task(tmp_path, order="precedence").seq_len <= 64
    assert task(tmp_path, cot=False).seq_len < t.seq_len
    assert len(t.text((9, 9, 9, 9), "***")) == t.seq_len  # the bound is reached
    assert ((t.generate(3000, seed=0).tokens != t.vocab.index("$")).sum(1) < t.seq_len).all()


def test_example_serialization_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "problems.txt"
    path.write_text("# hand written\n3+4*2\n 9 - 7 * 8 = 16\n\n")
    t = task(tmp_path, n_ops=2)
    test = Split.from_examples(t.read_file(path))
    assert len(test) == 2
    assert t.decode(test.tokens[0]) == "3+4*2:3+4=7,7*2=14#14".ljust(t.seq_len, "$")
    assert t.decode(test.tokens[1]).startswith("9-7*8:9-7=2,2*8=16#16$")
    assert test.answer_mask[0].nonzero()[0].item() == len("3+4*2:")
    assert t.final_answer(test.tokens[0][test.answer_mask[0]]) == 14
    assert torch.equal(tokens_of(t, t.decode(test.tokens[0]).rstrip("$")), test.tokens[0])


def test_precedence_order_follows_python(tmp_path: Path) -> None:
    t = task(tmp_path, order="precedence")
    assert t.text((3, 4, 2), "+*") == "3+4*2:4*2=8,3+8=11#11$"
    assert t.text((9, 7, 8, 1), "-*-") == "9-7*8-1:7*8=56,9-56=-47,-47-1=-48#-48$"


def test_score_reads_only_the_final_answer(tmp_path: Path) -> None:
    t = task(tmp_path)
    prompt = "3+4*2:"
    target = tokens_of(t, prompt + "3+4=7,7*2=14#14$")
    mask = torch.arange(t.seq_len) >= len(prompt)
    cases = {
        "3+4=7,7*2=14#14$": True,  # the reference
        "3+4=9,9*2=11#14$": True,  # wrong chain of thought, right answer: counts
        "#14$": True,  # no chain of thought at all
        "3+4=7,7*2=14#14$#99": True,  # anything after the end token is ignored
        "3+4=7,7*2=14#15$": False,  # wrong answer
        "3+4=7,7*2=14#-14$": False,
        "3+4=7,7*2=14#014$": False,  # not a canonical integer
        "3+4=7,7*2=14#$": False,  # empty answer
        "3+4=7,7*2=14,14$": False,  # no answer marker
        "3+4=7,7*2=14#1*4$": False,
    }
    predicted = torch.stack([tokens_of(t, prompt + answer) for answer in cases])
    no_end = target.clone()
    no_end[mask] = t.vocab.index("4")  # the answer region never ends
    masked = target.clone()
    digits = len(prompt + "3+4=7,7*2=14#")
    masked[digits : digits + 2] = t.mask_id  # the digits of the answer still masked (a partial sample)
    predicted = torch.cat([predicted, no_end[None], masked[None]])
    targets = target.expand(len(predicted), -1)
    expected = torch.tensor([*cases.values(), False, False])
    assert torch.equal(t.score(predicted, targets, mask.expand_as(targets)), expected)
    out_of_vocab = target.clone()
    out_of_vocab[len(prompt)] = 99
    assert t.score(out_of_vocab[None], target[None], mask[None]).tolist() == [True]  # garbage CoT, right answer


def test_score_on_generated_splits(tmp_path: Path) -> None:
    t = task(tmp_path)
    test = t.load_splits()["test"]
    assert t.score(test.tokens, test.tokens, test.answer_mask).all()
    blank = test.tokens.masked_fill(test.answer_mask, t.mask_id)
    assert not t.score(blank, test.tokens, test.answer_mask).any()
    shifted = test.tokens.roll(1, 0)  # another problem's answer region (answers differ for most)
    agree = [t.final_answer(a[m]) == t.final_answer(b[m]) for a, b, m in zip(shifted, test.tokens, test.answer_mask)]
    assert t.score(shifted, test.tokens, test.answer_mask).tolist() == agree


def test_splits_are_disjoint_deterministic_and_keyed_by_problem(tmp_path: Path) -> None:
    t = task(tmp_path, n_ops=1, operand_range=[0, 12], operators="+-", n_train=60)  # 338 problems only
    splits = t.load_splits()
    keys = np.concatenate([s.keys for s in splits.values()])
    assert len(keys) == 120 and len(set(keys.tolist())) == 120
    again = task(tmp_path / "fresh", n_ops=1, operand_range=[0, 12], operators="+-", n_train=60).load_splits()
    for name in splits:
        assert torch.equal(splits[name].tokens, again[name].tokens)
    # keys hash the problem, not its serialization: the same problem without CoT has the same key
    with_cot, without = task(tmp_path).generate(50, seed=3), task(tmp_path, cot=False).generate(50, seed=3)
    assert (with_cot.keys == without.keys).all() and with_cot.tokens.shape != without.tokens.shape


def test_test_file_with_a_training_problem_is_refused(tmp_path: Path) -> None:
    t = task(tmp_path)
    train = t.load_splits()["train"]
    problem = t.decode(train.tokens[0]).split(":")[0]
    path = tmp_path / "leak.txt"
    path.write_text(problem + "\n")
    with pytest.raises(DataFormatError, match="both the train and test splits"):
        task(tmp_path, test_file=str(path)).load_splits()


def test_fingerprint_changes_with_difficulty(tmp_path: Path) -> None:
    base = task(tmp_path).fingerprint()
    changes = [{"n_ops": 2}, {"operand_range": [1, 9]}, {"operators": "+*"}, {"order": "precedence"},
               {"cot": False}, {"seed": 1}]
    prints = {task(tmp_path, **change).fingerprint() for change in changes}
    assert base not in prints and len(prints) == len(changes)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"n_ops": 0}, "n_ops=0 must lie in [1, 8]"),
        ({"operand_range": [5, 2]}, "operand_range=[5, 2] must satisfy 0 <= lo <= hi <= 999"),
        ({"operand_range": [-3, 9]}, "must satisfy 0 <= lo"),
        ({"operators": "+/"}, "operators='+/' must be distinct characters from '+-*'"),
        ({"operators": "++"}, "must be distinct"),
        ({"operators": ""}, "must be distinct"),
        ({"order": "right"}, "order='right': expected one of 'left', 'precedence'"),
        ({"n_ops": 1, "operand_range": [0, 3], "operators": "+"}, "give only 16"),
        ({"workers": 4}, "workers=4: task arithmetic generates its data in one process"),  # was silently ignored
    ],
)
def test_bad_settings_are_rejected(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        task(tmp_path, **settings)


@pytest.mark.parametrize(
    "line, message",
    [
        ("3+4", ":2: expected 3 operators, got 1"),
        ("3+4*2/1", r":2: expected a problem like 3\+4\*2 \(optionally =answer\), got '3\+4\*2/1'"),
        ("3+4*x-1", ":2: expected a problem like"),
        ("3+4**2-1", ":2: expected a problem like"),
        ("-3+4*2-1", ":2: expected a problem like"),
        ("3+4*2-10", r":2: operands must lie in operand_range \[0, 9\]"),
        ("3+4*2-1=12", ":2: stated answer '12' is not 13"),
        ("3+4*2-1=1=3", ":2: stated answer '1=3' is not 13"),
    ],
)
def test_malformed_file_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(f"1+2+3+4\n{line}\n")
    with pytest.raises(DataFormatError, match=message):
        task(tmp_path).read_file(path)


def test_file_operators_and_stated_answers_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "problems.txt"
    path.write_text("1*2*3*4\n")
    with pytest.raises(DataFormatError, match=r":1: operators '\*\*\*' are not all in operators='\+-'"):
        task(tmp_path, operators="+-").read_file(path)
    path.write_text("2+3*4-1=13\n")
    assert len(task(tmp_path, order="precedence").read_file(path)) == 1
    with pytest.raises(DataFormatError, match=r":1: stated answer '13' is not 19 \(order=left\)"):
        task(tmp_path).read_file(path)
    path.write_text("# nothing\n\n")
    with pytest.raises(DataFormatError, match="no problems found"):
        task(tmp_path).read_file(path)


def test_builds_from_the_hydra_config(tmp_path: Path) -> None:
    cfg = compose_config("train", ["task=arithmetic", "task.n_train=100", "task.order=precedence",
                                   "task.operators=+*"])
    t = build(cfg.task, "task")
    assert isinstance(t, ArithmeticTask)
    assert (t.n_ops, t.operand_range, t.operators, t.order, t.cot) == (3, (0, 9), "+*", "precedence", True)
    assert t.cache_dir == os.environ["MDMKIT_CACHE_DIR"]
    bad = compose_config("train", ["task=arithmetic", "task.n_ops=9"])
    with pytest.raises(ConfigError, match=r"^task: n_ops=9 must lie in \[1, 8\]$"):
        build(bad.task, "task")


def test_a_checkpoint_keeps_none_of_its_trainers_machine_settings(tmp_path: Path) -> None:
    """A run saved with `task.workers=4` (silently ignored then, refused now) still loads, with this machine's."""
    saved = torch.load(ROOT / "checkpoints/arithmetic_mdm.pt", weights_only=False)
    saved["config"]["task"].update(workers=4, cache_dir="/trainers/cache")
    torch.save(saved, tmp_path / "model.pt")
    task = TrainedModel(tmp_path / "model.pt").task
    assert task.workers == 1 and task.cache_dir == os.environ["MDMKIT_CACHE_DIR"]

"""Rewards from the tasks' own verifiers, composed with weights, and what goes wrong contained or said in one line:
a reward that raises (counted, scored 0), the wrong shape or a value that is not finite (one line), rollouts the
sampler never finished (scored 0, counted, left out of the likelihood), a group of one (one line)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from fakes import random_transformer

from mdmkit.core.errors import ConfigError
from mdmkit.samplers import Sampler, ThresholdSampler
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.protocol import Canvas, Sampled
from mdmkit.tasks.arithmetic import ArithmeticTask
from mdmkit.tasks.code import HumanEvalTask
from mdmkit.tasks.gsm8k import GSM8KTask
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.rewards import (
    AnswerAccuracy,
    ExactSolution,
    FormatReward,
    NFECharge,
    Reward,
    RewardError,
    Task,
    Verified,
    score_rollouts,
)
from mdmkit.training.rl.rollout import Rollouts
from mdmkit.training.rl.step import collect, inner_loss


def _arithmetic() -> tuple[ArithmeticTask, Rollouts]:
    """Four rollouts of two problems: the reference answer, a wrong final answer, one cell off, and unfinished."""
    task = ArithmeticTask(n_train=50, n_val=10, n_test=10)
    examples = task.generate(2, 0)
    target = torch.as_tensor(examples.tokens).repeat_interleave(2, 0)
    answer = torch.as_tensor(examples.answer_mask).repeat_interleave(2, 0)
    tokens = target.clone()
    hash_at = [task.vocab.index("#") == int(t) for t in tokens[1]].index(True)
    tokens[1, hash_at + 1] = task.vocab.index("7") if task.decode(tokens[1])[hash_at + 1] != "7" else \
        task.vocab.index("8")
    tokens[2, int(answer[2].nonzero()[0])] = task.vocab.index("9") if task.decode(tokens[2])[8] != "9" else \
        task.vocab.index("8")
    tokens[3, int(answer[3].nonzero()[-1])] = task.mask_id
    nfe = torch.tensor([32, 10, 5, 40])
    return task, Rollouts(tokens, target, answer, nfe, task.mask_id, 2)


def test_verifier_exact_solution_and_answer_accuracy_of_arithmetic_rollouts() -> None:
    task, rollouts = _arithmetic()
    assert rollouts.finished.tolist() == [True, True, True, False]
    result = score_rollouts({"verified": Verified(), "exact": ExactSolution(), "cells": AnswerAccuracy()},
                            rollouts, task)
    assert result.parts["verified"].tolist() == [1.0, 0.0, 1.0, 0.0]  # a wrong step keeps the right final answer
    assert result.parts["exact"].tolist() == [1.0, 0.0, 0.0, 0.0]
    length = rollouts.answer_mask[0].sum().item()
    assert result.parts["cells"].tolist() == pytest.approx([1.0, 1 - 1 / length, 1 - 1 / length, 0.0])
    assert not result.failed


def test_weights_add_up_and_an_nfe_charge_applies_to_unfinished_rollouts_too() -> None:
    task, rollouts = _arithmetic()
    result = score_rollouts({"verified": Verified(weight=2.0), "nfe": NFECharge(per_forward=0.01),
                             "format": FormatReward(pattern=r"#-?\d+\$", weight=0.5)}, rollouts, task)
    assert result.parts["nfe"].tolist() == pytest.approx([-0.32, -0.10, -0.05, -0.40])
    assert result.parts["format"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert result.total.tolist() == pytest.approx([2.18, 0.4, 2.45, -0.40])


def test_gsm8k_answers_and_humaneval_programs_in_the_sandbox(allow_code_execution: None) -> None:
    """A program that hangs is a contained 0 (the sandbox's time limit), never a stalled run."""
    gsm = GSM8KTask()
    doc = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    texts = ["2 + 3 = 5. The answer is 5.", "The answer is 6.", "no answer"]
    rollouts = Rollouts(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long),
                        torch.ones(3, 1, dtype=torch.bool), torch.ones(3, dtype=torch.long), 9, 3, texts, [doc] * 3)
    assert score_rollouts({"v": Verified()}, rollouts, gsm).total.tolist() == [1.0, 0.0, 0.0]
    human = HumanEvalTask(sandbox_timeout_s=1.0)
    doc = {"task_id": "t/0", "prompt": "def f(x):\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    programs = ["    return x + 1\n", "    while True:\n        pass\n", "    return x\n"]
    rollouts = Rollouts(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long),
                        torch.ones(3, 1, dtype=torch.bool), torch.ones(3, dtype=torch.long), 9, 3, programs, [doc] * 3)
    assert score_rollouts({"tests": Verified()}, rollouts, human).total.tolist() == [1.0, 0.0, 0.0]


@dataclass
class Raises(Reward):
    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        raise ValueError("cannot parse")


@dataclass
class Gives(Reward):
    value: list[float] | None = None

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        return self.value or []


def test_a_reward_that_raises_is_contained_counted_and_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    task, rollouts = _arithmetic()
    failures: Counter[str] = Counter()
    for _ in range(3):
        result = score_rollouts({"bad": Raises(), "verified": Verified()}, rollouts, task, failures)
        assert result.total.tolist() == [1.0, 0.0, 1.0, 0.0] and result.failed == ["bad"]
    assert failures == {"bad": 3}
    lines = capsys.readouterr().err.strip().splitlines()
    said = ("warning: reward bad (Raises) raised ValueError: cannot parse; its rollouts score 0 this batch "
            "(counted in rl/reward_failures)")
    assert lines == [said]


def test_a_reward_of_the_wrong_shape_or_not_finite_is_one_line() -> None:
    task, rollouts = _arithmetic()
    with pytest.raises(RewardError, match=r"reward short \(Gives\) gave shape \(2,\) for 4 rollouts: a reward is "
                                          "one number per rollout"):
        score_rollouts({"short": Gives(value=[1.0, 0.0])}, rollouts, task)
    with pytest.raises(RewardError, match="gave a value that is not finite"):
        score_rollouts({"nan": Gives(value=[1.0, float("nan"), 0.0, 0.0])}, rollouts, task)


def test_a_group_of_one_and_identical_rollouts_are_one_line() -> None:
    with pytest.raises(ConfigError, match="group_size=1: a group of one has no baseline"):
        RLConfig(group_size=1)
    with pytest.raises(ConfigError, match="rewards.verified is not a reward"):
        RLConfig(rewards={"verified": 1.0})
    with pytest.raises(ConfigError, match="sampler.temperature=0: the 8 rollouts of a prompt would all be the same"):
        RLConfig(sampler=ThresholdSampler())
    RLConfig(sampler=ThresholdSampler(ordering="random"))  # random orders differ at temperature 0


@dataclass
class GivesUp(Sampler):
    """Runs out of its budget after one forward: fills the first masked position of every other row only."""

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        rows = torch.arange(canvas.tokens.shape[0])
        logits = network(canvas.tokens, rows)
        tokens = canvas.tokens.clone()
        for row in rows[::2]:
            masked = (tokens[row] == canvas.mask_id).nonzero().flatten()
            tokens[row, masked[0]] = logits[row, masked[0], : canvas.mask_id].argmax()
        return Sampled(tokens, torch.zeros_like(tokens), torch.ones(len(rows), dtype=torch.long))


def test_rollouts_the_sampler_never_finishes_score_0_and_leave_the_likelihood() -> None:
    task = ArithmeticTask(n_train=50, n_val=10, n_test=10)
    examples = task.generate(2, 0)
    tokens, answer = torch.as_tensor(examples.tokens), torch.as_tensor(examples.answer_mask)
    network = random_transformer(task.vocab_size, task.seq_len, seed=0, n_layers=1, d_model=16)
    settings = RLConfig(group_size=2, sampler=GivesUp(), rewards={"cells": AnswerAccuracy(), "nfe": NFECharge()})
    experience = collect(network, None, settings, task, tokens, answer, seed=0)
    rollouts = experience.rollouts
    assert not rollouts.finished.any()
    assert experience.rewards.parts["cells"].tolist() == [0.0] * 4  # not shown to the reward
    assert experience.rewards.total.tolist() == pytest.approx([-0.01] * 4)  # the forward is still charged
    assert experience.metrics()["unfinished"] == 1.0
    assert rollouts.completion.sum(1).tolist() == [1, 0, 1, 0]  # only what was filled is scored
    loss, _ = inner_loss(network, settings, experience, 0, task.mask_id)
    assert torch.isfinite(loss)


def test_a_text_rollouts_answer_ends_at_its_end_token_or_stop_and_masks_left_unfinish_it() -> None:
    from mdmkit.training.rl.text_rollout import _answer

    end, mask = 2, 9
    assert _answer([5, 6, end, 7, 7], mask, (end,), stopped=True) == (3, 2)  # scored through the end token
    assert _answer([5, 6, 7, mask, mask], mask, (end,), stopped=True) == (3, 3)  # a stop phrase: the settled part
    assert _answer([5, mask, 7, mask, 8], mask, (end,), stopped=False) == (5, 1)  # out of budget: masks inside
    assert _answer([5, 6, 7, 8, 8], mask, (end,), stopped=False) == (5, 5)

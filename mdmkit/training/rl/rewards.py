"""Rewards from the tasks' own verifiers, composable with weights (`rl.rewards`: a name -> reward mapping).

A reward gives one number per rollout. `score_rollouts` adds them up, each times its `weight`, and contains
what can go wrong in one: a reward that raises scores 0 for that batch, and is counted and said once; one that
gives the wrong shape, or a value that is not finite, stops the run with one line (a bug, not bad luck).
Rollouts the sampler did not finish within its budget are not shown to a verifier: they score 0 (an NFE charge
still applies), and are counted.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mdmkit.core.config import Validated, require
from mdmkit.core.errors import ConfigError, MdmkitError
from mdmkit.tasks.base import PuzzleTask
from mdmkit.tasks.text import TextTask
from mdmkit.training.rl.rollout import Rollouts

Task = PuzzleTask | TextTask


class RewardError(MdmkitError):
    """A reward that broke its contract (one number per rollout, finite)."""


@dataclass
class Reward(Validated):
    """Base: `score(rollouts, task)` -> [B] (a tensor or a sequence of numbers); the total adds it times
    `weight`. `scores_unfinished`: whether rollouts the sampler left unfinished are scored too (else they get 0)."""

    weight: float = 1.0
    scores_unfinished: ClassVar[bool] = False

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        raise NotImplementedError


@dataclass
class Verified(Reward):
    """1 when the task's verifier accepts the rollout: a Sudoku grid valid and keeping its givens, a maze's exact
    path, arithmetic's final answer; GSM8K's answer match; HumanEval / MBPP tests passed in the sandbox (a program
    that hangs or attacks fails there, on its own, and scores 0)."""

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        if isinstance(task, TextTask):
            assert rollouts.docs is not None, "text rollouts carry their documents"
            return [float(verdict.correct) for verdict in task.score(list(rollouts.docs), rollouts.text(None))]
        return task.score(rollouts.tokens, rollouts.target, rollouts.answer_mask).float()


def _puzzle(task: Task, name: str) -> None:
    require(isinstance(task, PuzzleTask), f"reward {name} compares with the task's reference answer: a generated "
            "task's (Sudoku, maze, arithmetic); use `verified` for a text task")


@dataclass
class ExactSolution(Reward):
    """1 when every answer position holds the reference solution's token (a puzzle with a unique solution: the
    same as `verified`; with several, only the reference one)."""

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        _puzzle(task, "exact_solution")
        return ((rollouts.tokens == rollouts.target) | ~rollouts.answer_mask).all(1).float()


@dataclass
class AnswerAccuracy(Reward):
    """The share of answer positions holding the reference token: a dense signal (each right Sudoku cell counts)
    where the solved / not-solved reward is mostly 0 early on."""

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        _puzzle(task, "answer_accuracy")
        right = ((rollouts.tokens == rollouts.target) & rollouts.answer_mask).sum(1)
        return right.float() / rollouts.answer_mask.sum(1).clamp(min=1).float()


@dataclass
class FormatReward(Reward):
    """1 when the rollout's text (a puzzle's decoded tokens, space-separated) matches the regular expression
    `pattern` (`re.search`; anchor it with ^...$ to require the whole)."""

    pattern: str = "."

    def validate(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as error:
            raise ConfigError(f"pattern={self.pattern!r} is not a regular expression: {error}") from None

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        compiled = re.compile(self.pattern)
        return [float(compiled.search(text) is not None) for text in rollouts.text(task if isinstance(task, PuzzleTask)
                                                                                      else None)]


@dataclass
class NFECharge(Reward):
    """-per_forward x the rollout's forwards: accuracy per forward is what a fast sampler is for, so a policy may
    be paid for needing fewer of them (with an adaptive sampler such as threshold or EB). Unfinished rollouts are
    charged too."""

    per_forward: float = 0.01
    scores_unfinished: ClassVar[bool] = True

    def validate(self) -> None:
        require(self.per_forward >= 0, f"per_forward={self.per_forward} must be >= 0")

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        return -self.per_forward * rollouts.nfe.float()


@dataclass
class RewardResult:
    """The weighted total [B], each reward's unweighted part [B], and the calls that raised (per reward name)."""

    total: torch.Tensor
    parts: dict[str, torch.Tensor]
    failed: list[str] = field(default_factory=list)


def score_rollouts(rewards: Mapping[str, Reward], rollouts: Rollouts, task: Task,
                   failures: Counter[str] | None = None) -> RewardResult:
    """Every reward of `rewards` on `rollouts`, weighted and added. A reward that raises scores 0 for this batch,
    is added to `failures` and said in one line the first time; a wrong shape or a value that is not finite is a
    `RewardError`."""
    rows, device = len(rollouts), rollouts.tokens.device
    finished = rollouts.finished.to(device)
    total = torch.zeros(rows, device=device)
    parts: dict[str, torch.Tensor] = {}
    failed = []
    for name, reward in rewards.items():
        try:
            raw = reward.score(rollouts, task)
        except MdmkitError:
            raise
        except Exception as error:  # noqa: BLE001 -- a reward's failure is contained: counted, said once, scored 0
            failed.append(name)
            if failures is not None:
                if not failures[name]:
                    print(f"warning: reward {name} ({type(reward).__name__}) raised {type(error).__name__}: {error}; "
                          "its rollouts score 0 this batch (counted in rl/reward_failures)", file=sys.stderr)
                failures[name] += 1
            raw = torch.zeros(rows)
        value = torch.as_tensor(raw, dtype=torch.float32).to(device)
        if value.shape != (rows,):
            raise RewardError(f"reward {name} ({type(reward).__name__}) gave shape {tuple(value.shape)} for {rows} "
                              "rollouts: a reward is one number per rollout")
        if not torch.isfinite(value).all():
            raise RewardError(f"reward {name} ({type(reward).__name__}) gave a value that is not finite "
                              f"({value[~torch.isfinite(value)][0].item()}): a reward is a finite number")
        if not reward.scores_unfinished:
            value = torch.where(finished, value, 0.0)
        parts[name] = value
        total = total + reward.weight * value
    return RewardResult(total, parts, failed)

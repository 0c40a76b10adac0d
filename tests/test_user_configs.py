"""A user's own sampler and task, outside the package, plugged in through `hydra.searchpath`.

tests/user_configs/ is docs/extending.md's example: my_extension.py defines a sampler
(mdmkit's masked loop with a budget rule of its own) and a Sudoku variant; my_conf/ holds their options.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_config, run_cli
from fakes import random_transformer

from mdmkit.core.config import build
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import ForwardCounter, MaskedSampler
from mdmkit.tasks.sudoku import SudokuTask

EXAMPLE = Path(__file__).parent / "user_configs"
SEARCHPATH = f"hydra.searchpath=[file://{EXAMPLE / 'my_conf'}]"
SMALL_DATA = ["task.n_train=300", "task.n_val=40", "task.n_test=40", "task.workers=1"]


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's module importable here and in subprocesses, as a user's PYTHONPATH makes it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))


def test_the_user_options_compose_with_mdmkits_and_build(importable: None) -> None:
    cfg = compose_config("evaluate", ["ckpt=x.pt", SEARCHPATH, "sampler=fraction", "sampler.fraction=0.25",
                                      "sampler.ordering=entropy", "task=easy_sudoku"])
    sampler, task = build(cfg.sampler, "sampler"), build(cfg.task, "task")
    assert isinstance(sampler, MaskedSampler) and (sampler.fraction, sampler.ordering) == (0.25, "entropy")
    assert isinstance(task, SudokuTask) and task.name == "easy_sudoku"
    assert (task.n_givens, task.n_test) == (60, 1000)  # its own givens, the rest from mdmkit's sudoku option

    x = torch.full((3, 16), 8)
    counter = ForwardCounter(random_transformer(9, 16), len(x))
    out = sampler.sample(counter, x, 8)
    assert not (out.tokens == 8).any()
    # a quarter of what is left each step, at least one: 16 -> 12 -> 9 -> 7 -> 6 -> 5 -> 4 -> 3 -> 2 -> 1 -> 0
    assert out.steps.tolist() == [10] * 3


def test_a_bad_user_value_is_one_config_error(importable: None) -> None:
    cfg = compose_config("evaluate", ["ckpt=x.pt", SEARCHPATH, "sampler=fraction", "sampler.fraction=2"])
    with pytest.raises(ConfigError, match=r"sampler: fraction=2 must lie in \(0, 1\]"):
        build(cfg.sampler, "sampler")


def test_evaluate_runs_the_user_sampler_on_the_user_task(importable: None, tiny_checkpoint: Path,
                                                         tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    out = run_cli("evaluate.py", SEARCHPATH, f"ckpt={tiny_checkpoint}", "sampler=fraction", "task=easy_sudoku",
                  *SMALL_DATA, "limit=8", f"results_file={results}", "wandb.mode=disabled", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["task"] == "easy_sudoku" and row["n"] == 8
    assert row["sampler"]["_target_"] == "my_extension.FractionSampler" and row["family"] == "fraction-confidence"


def test_the_user_objective_masks_on_its_cosine_schedule(importable: None) -> None:
    cfg = compose_config("train", [SEARCHPATH, "objective=cosine_masking"])
    objective = build(cfg.objective, "objective")
    assert type(objective).__name__ == "CosineMaskingLoss" and objective.t_min == 0.001  # mdmkit's default kept
    tokens, answer = torch.arange(8).repeat(2000, 1), torch.arange(8).repeat(2000, 1) >= 2
    corruption = objective.corrupt(tokens, answer, 99, torch.Generator().manual_seed(0))
    u = torch.rand(2000, generator=torch.Generator().manual_seed(0))  # the same first draws
    assert torch.allclose(corruption.t, (1 - torch.cos(torch.pi * u / 2)).clamp(min=0.001))
    assert not corruption.masked[:, :2].any() and (corruption.noisy[corruption.masked] == 99).all()
    # E[t] = 1 - 2/pi under the cosine schedule (0.5 under the linear one): the masked share of answer cells
    assert corruption.masked[:, 2:].float().mean().item() == pytest.approx(1 - 2 / torch.pi, abs=0.02)
    with pytest.raises(ConfigError, match="weighting=elbo"):
        build(compose_config("train", [SEARCHPATH, "objective=cosine_masking", "objective.weighting=elbo"]).objective,
              "objective")


def test_train_runs_with_the_user_objective(importable: None, tmp_path: Path) -> None:
    out = run_cli("train.py", SEARCHPATH, "objective=cosine_masking", *TINY, f"hydra.run.dir={tmp_path}/run",
                  f"results_file={tmp_path}/t.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    saved = torch.load(tmp_path / "run" / "model.pt", map_location="cpu", weights_only=False)
    assert saved["config"]["objective"]["_target_"] == "my_extension.CosineMaskingLoss"

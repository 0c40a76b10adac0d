"""The committed reference checkpoints load, solve held-out puzzles, and reproduce their results pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdmkit.evaluation.runner import sample_split
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import TopKSampler
from mdmkit.tasks.base import Split

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ["sudoku_mdm", "maze_mdm"]


def page(name: str) -> dict:
    return json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", REFERENCES)
def test_reference_model_solves_the_first_test_puzzles(name: str) -> None:
    trained = TrainedModel(ROOT / "checkpoints" / f"{name}.pt")
    assert trained.config["run_name"] == name
    # The test split is the head of the generation stream, so these are the first 32 test examples (at the page's
    # ~93%, 0.15 below it is over three standard deviations of 32 draws away).
    first = Split.from_examples(trained.task.generate(32, trained.task.seed))
    result = sample_split(trained.network(), trained.task, first, TopKSampler(k=1), batch_size=32)
    assert result.accuracy >= page(name)["test_accuracy"] - 0.15
    assert (result.nfe == first.answer_mask.sum(1).numpy()).all()  # full-step: one pass per answer token


@pytest.mark.slow
@pytest.mark.parametrize("name", REFERENCES)
def test_reference_model_reproduces_its_results_page(name: str, tmp_path: Path) -> None:
    trained = TrainedModel(ROOT / "checkpoints" / f"{name}.pt")
    test = trained.task.load_splits()["test"]
    result = sample_split(trained.network(), trained.task, test, TopKSampler(k=1), batch_size=256)
    expected = page(name)
    assert result.accuracy == pytest.approx(expected["test_accuracy"], abs=1e-12)
    assert float(result.nfe.mean()) == pytest.approx(expected["nfe_mean"], abs=1e-12)

"""One answer from evaluate.py and mdmkit-lm-eval: lm-eval's samples of one of mdmkit's tasks (`mdmkit_gsm8k`,
`mdmkit_humaneval`, `mdmkit_mbpp`) for a model, offline on the benchmark files, beside the generations evaluate.py
wrote for a row of the same task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import BENCHMARK_DATA


def lm_eval_samples(monkeypatch: pytest.MonkeyPatch, model_args: str, gen: int, limit: int, batch_size: int,
                    task: str = "gsm8k", **options: Any) -> list[dict[str, Any]]:
    """The samples `mdmkit-lm-eval --tasks mdmkit_<task>` makes with `model_args`, in document order."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    import mdmkit.evaluation.lm_eval_model  # noqa: F401  (registers model="mdmkit")
    from mdmkit.lm_eval_tasks import utils

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)
    utils.task.cache_clear()
    tasks = TaskManager(include_path=str(Path(utils.__file__).parent), include_defaults=False)
    results = lm_eval.simple_evaluate(
        model="mdmkit", model_args=model_args, gen_kwargs=f"max_gen_toks={gen}", tasks=[f"mdmkit_{task}"],
        limit=limit, batch_size=batch_size, device="cpu", task_manager=tasks, verbosity="ERROR", log_samples=True,
        **options)
    return sorted(results["samples"][f"mdmkit_{task}"], key=lambda sample: sample["doc_id"])


def generations(directory: Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """What evaluate.py wrote for `row` (under `directory`/generations), in document order."""
    lines = (directory / "generations" / f"{row['task']}-{row['key']}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_one_answer(samples: list[dict[str, Any]], ours: list[dict[str, Any]]) -> None:
    """Equal answers, verdicts and forwards (to the end and to the stop), document by document."""
    assert len(samples) == len(ours) > 0
    assert [sample["filtered_resps"][0] for sample in samples] == [doc["generation"] for doc in ours]
    assert [sample["accuracy"] for sample in samples] == [float(doc["correct"]) for doc in ours]
    assert [(sample["nfe"], sample["nfe_to_stop"]) for sample in samples] == [(doc["nfe"], doc["nfe_to_stop"])
                                                                              for doc in ours]

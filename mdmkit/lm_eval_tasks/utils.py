"""Glue between lm-eval task YAMLs and mdmkit's text tasks: same documents, prompts, stop phrases and scoring.

Each task is built with its config defaults; `MDMKIT_BENCHMARK_DATA` points them at local files (else the hub).
The few-shot exemplars go through lm-eval's own few-shot mechanism (`num_fewshot`, `fewshot_config`), so the
results table shows the shots a task really used and `--num_fewshot` changes them: the question of a document is
mdmkit's prompt without shots, an exemplar's answer is what mdmkit's prompt puts after its question, and lm-eval
joins them with the delimiters below, rebuilding mdmkit's prompt exactly (`tests/test_lm_eval_model.py` checks
it). The pool of exemplars starts with mdmkit's own, in its order (`first_n`).

Scores: `accuracy`, and with the `mdmkit` model the answer's forward passes, `nfe` and `nfe_to_stop`
(`mdmkit.evaluation.lm_eval_nfe.Generation`; read by attribute, as this layer sits below the model's).
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mdmkit.lm_eval_tasks import scoring_skipped
from mdmkit.tasks.code import MBPP_SPLITS, HumanEvalTask, MBPPTask
from mdmkit.tasks.gsm8k import GSM8KTask
from mdmkit.tasks.text import TextTask

if TYPE_CHECKING:
    from datasets import DatasetDict

_TASKS = {"gsm8k": GSM8KTask, "humaneval": HumanEvalTask, "mbpp": MBPPTask}
# (between an exemplar's question and its answer, after its answer): the YAMLs' target_/fewshot_delimiter
DELIMITERS = {"gsm8k": (" ", "\n\n"), "mbpp": ("", "\n\n")}


@cache
def task(name: str) -> TextTask:
    return _TASKS[name](data_dir=os.environ.get("MDMKIT_BENCHMARK_DATA"))


@runtime_checkable
class Counted(Protocol):
    """An answer that carries its forward passes: mdmkit's `Generation` (None where lm-eval made it from other
    text). A protocol, as that class sits in a layer above this one."""

    nfe: int | None
    nfe_to_stop: int | None


def _dataset(name: str) -> DatasetDict:
    import datasets

    if not scoring_skipped():  # lm-eval loads the data before generating: a refused sandbox stops here
        task(name).check_can_score()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(task(name).docs("test"))})


def _question(name: str, doc: dict) -> str:
    """The document's prompt without exemplars (lm-eval puts the exemplars before it)."""
    return task(name).format_prompt(doc, [])


def _shot_answer(name: str, doc: dict) -> str:
    """What mdmkit's prompt puts after `doc`'s question when `doc` is an exemplar."""
    question, (between, after) = _question(name, doc), DELIMITERS[name]
    whole = task(name).format_prompt(doc, [doc])  # doc as its own exemplar: question, answer, question
    head, tail = question + between, after + question
    if not (whole.startswith(head) and whole.endswith(tail) and len(whole) > len(head) + len(tail)):
        raise ValueError(f"mdmkit_{name}: an exemplar is not '<question>{between!r}<answer>{after!r}'")
    return whole[len(head): len(whole) - len(tail)]


def _score(name: str, doc: dict, results: list[str]) -> dict[str, float]:
    answer = results[0]
    scores = {"accuracy": float(task(name).score([doc], [answer])[0].correct)}
    # an mdmkit generation (other models' answers carry no NFE)
    if isinstance(answer, Counted) and answer.nfe is not None and answer.nfe_to_stop is not None:
        scores |= {"nfe": float(answer.nfe), "nfe_to_stop": float(answer.nfe_to_stop)}
    return scores


def gsm8k_dataset(**_: object) -> DatasetDict:
    return _dataset("gsm8k")


def humaneval_dataset(**_: object) -> DatasetDict:
    return _dataset("humaneval")


def mbpp_dataset(**_: object) -> DatasetDict:
    return _dataset("mbpp")


def gsm8k_prompt(doc: dict) -> str:
    return _question("gsm8k", doc)


def humaneval_prompt(doc: dict) -> str:
    return _question("humaneval", doc)


def mbpp_prompt(doc: dict) -> str:
    return _question("mbpp", doc)


def gsm8k_fewshot() -> list[dict]:
    """The train split in order: its first n are mdmkit's n-shot exemplars."""
    return task("gsm8k").docs("train")


def mbpp_fewshot() -> list[dict]:
    """The prompt split, mdmkit's exemplars (`fewshot_ids`) first."""
    mbpp = task("mbpp")
    assert isinstance(mbpp, MBPPTask)
    ids = list(mbpp.fewshot_ids) + [i for i in MBPP_SPLITS["prompt"] if i not in mbpp.fewshot_ids]
    by_id = {doc["task_id"]: doc for doc in mbpp.docs("prompt")}
    return [by_id[i] for i in ids if i in by_id]


def gsm8k_shot_answer(doc: dict) -> str:
    return _shot_answer("gsm8k", doc)


def mbpp_shot_answer(doc: dict) -> str:
    return _shot_answer("mbpp", doc)


def gsm8k_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("gsm8k", doc, results)


def humaneval_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("humaneval", doc, results)


def mbpp_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("mbpp", doc, results)

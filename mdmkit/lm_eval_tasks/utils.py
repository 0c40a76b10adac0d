"""Glue between lm-eval task YAMLs and mdmkit's text tasks: same documents, prompts, stop phrases and scoring.

Each task is built with its config defaults; `MDMKIT_BENCHMARK_DATA` points them at local files (else the hub).
The prompts already contain the task's few-shot exemplars, so the YAMLs use `num_fewshot: 0`.
"""

from __future__ import annotations

import os
from functools import cache

from mdmkit.tasks.code import HumanEvalTask, MBPPTask
from mdmkit.tasks.gsm8k import GSM8KTask
from mdmkit.tasks.text import TextTask

_TASKS = {"gsm8k": GSM8KTask, "humaneval": HumanEvalTask, "mbpp": MBPPTask}


@cache
def task(name: str) -> TextTask:
    return _TASKS[name](data_dir=os.environ.get("MDMKIT_BENCHMARK_DATA"))


def _dataset(name: str):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(task(name).docs("test"))})


def _prompt(name: str, doc: dict) -> str:
    mdm_task = task(name)
    return mdm_task.format_prompt(doc, mdm_task.fewshot_docs())


def _score(name: str, doc: dict, results: list[str]) -> dict[str, float]:
    return {"accuracy": float(task(name).score([doc], [results[0]])[0].correct)}


def gsm8k_dataset(**_):
    return _dataset("gsm8k")


def humaneval_dataset(**_):
    return _dataset("humaneval")


def mbpp_dataset(**_):
    return _dataset("mbpp")


def gsm8k_prompt(doc: dict) -> str:
    return _prompt("gsm8k", doc)


def humaneval_prompt(doc: dict) -> str:
    return _prompt("humaneval", doc)


def mbpp_prompt(doc: dict) -> str:
    return _prompt("mbpp", doc)


def gsm8k_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("gsm8k", doc, results)


def humaneval_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("humaneval", doc, results)


def mbpp_score(doc: dict, results: list[str]) -> dict[str, float]:
    return _score("mbpp", doc, results)

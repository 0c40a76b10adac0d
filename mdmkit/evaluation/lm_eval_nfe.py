"""NFE inside lm-eval's own outputs, for `MdmkitLM` (`lm_eval_model.py`).

lm-eval keeps what `generate_until` returns as the request's response, unchanged up to the task's filters and
`process_results`, and pickles it when it gathers ranks or caches responses. So each answer is returned as a
`Generation`: a `str` (every filter and metric reads it as the text) that also carries the forward passes of
its row, to full length and to the stop point. mdmkit's tasks report them as metrics (`lm_eval_tasks/utils.py`);
for any task, `attach_nfe` copies them into the logged samples.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from mdmkit.lm_eval_tasks import predictions_only

if TYPE_CHECKING:
    from typing_extensions import Self  # typing's from Python 3.11


class Generation(str):
    """Generated text that also carries its row's NFE (to full length, and to the point its stop was settled).

    lm-eval also builds strings of the answer's type from other text (`type(result)(gold)`): those carry None."""

    nfe: int | None
    nfe_to_stop: int | None

    def __new__(cls, text: str = "", nfe: int | None = None, nfe_to_stop: int | None = None) -> Self:
        made = super().__new__(cls, text)
        made.nfe = None if nfe is None else int(nfe)
        made.nfe_to_stop = None if nfe_to_stop is None else int(nfe_to_stop)
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by rank gathers and lm-eval's response cache
        return Generation, (str(self), self.nfe, self.nfe_to_stop)


def record(request: Any, made: Generation, sampler: dict[str, Any]) -> dict[str, Any]:
    """One request's NFE line (`nfe_file`, summaries): its task and document where lm-eval gives them."""
    return {"task": getattr(request, "task_name", None), "doc_id": getattr(request, "doc_id", None),
            "nfe": made.nfe, "nfe_to_stop": made.nfe_to_stop, "sampler": sampler}


def padding(requests: list[Any]) -> list[bool]:
    """Which requests are lm-eval's padding: with several ranks, a rank with fewer requests gets extra copies of
    its last one (`repeats` each) so that all ranks run as many; a copy beyond a request's `repeats`
    occurrences is padding. Its answer is never scored, so it is not generated again nor counted."""
    seen: dict[int, int] = {}
    flags = []
    for request in requests:
        seen[id(request)] = seen.get(id(request), 0) + 1
        flags.append(seen[id(request)] > int(getattr(request, "repeats", 1) or 1))
    return flags


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per task (`null` where requests name none): generations, mean NFE to full length and to the stop."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for line in records:
        by_task.setdefault(str(line["task"]), []).append(line)
    return {task: {"generations": len(lines), "nfe_mean": float(np.mean([r["nfe"] for r in lines])),
                   "nfe_to_stop_mean": float(np.mean([r["nfe_to_stop"] for r in lines]))}
            for task, lines in by_task.items()}


def attach_nfe(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """`results` of `simple_evaluate` with every logged sample given `mdmkit_nfe` and `mdmkit_nfe_to_stop`: the
    NFE of each of its generations, in the order of `resps` (one entry for a single-generation request). Answers
    beyond a request's `repeats` are lm-eval's padding (data parallel) and are left out."""
    if results is None:
        return None
    for task, samples in results.get("samples", {}).items():
        repeats = int((results.get("configs", {}).get(task) or {}).get("repeats") or 1)
        for sample in samples:
            made = [answer for answers in sample.get("resps", []) for answer in answers[:repeats]
                    if isinstance(answer, Generation) and answer.nfe is not None]
            if made:
                sample["mdmkit_nfe"] = [answer.nfe for answer in made]
                sample["mdmkit_nfe_to_stop"] = [answer.nfe_to_stop for answer in made]
    return results


def with_nfe(simple_evaluate: Callable[..., Any]) -> Callable[..., Any]:
    """`simple_evaluate` whose returned samples carry their NFE (`attach_nfe`); the other ranks' None stays. With
    `predict_only` (nothing is scored) mdmkit's code tasks load without the code sandbox's opt-in."""

    @functools.wraps(simple_evaluate)
    def evaluate(*args: Any, **kwargs: Any) -> Any:
        with predictions_only() if kwargs.get("predict_only") else nullcontext():
            return attach_nfe(simple_evaluate(*args, **kwargs))

    return evaluate

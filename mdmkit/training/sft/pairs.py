"""Prompt-response pairs for fine-tuning, as read from a JSONL file or a text task's training split, and how many of
them are held out for the validation loss.

Light (no torch, no Lightning): the CLI reads a pair file before anything heavy loads, so a malformed line stops a
run at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdmkit.core.errors import DataFormatError
from mdmkit.tasks.text import TextTask

HOLD_OUT_SHARE = 5  # a small pair file holds out at most a fifth of its pairs for validation

Messages = list[dict[str, str]]


@dataclass
class Pair:
    prompt: Messages  # the conversation up to the answer (one user turn for a plain prompt)
    response: str


def _pair(record: Any, where: str) -> Pair:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str):
        return Pair([{"role": "user", "content": record["prompt"]}], record["response"])
    messages = record.get("messages") if isinstance(record, dict) else None
    if isinstance(messages, list) and len(messages) >= 2 and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        if messages[-1]["role"] != "assistant":
            raise DataFormatError(f"{where}: the last message is the answer and must have role 'assistant', not "
                                  f"{messages[-1]['role']!r}")
        return Pair([dict(m) for m in messages[:-1]], messages[-1]["content"])
    raise DataFormatError(f"{where}: expected {{\"prompt\": str, \"response\": str}} or {{\"messages\": [{{\"role\", "
                          "\"content\"}, ...]}} ending in the assistant's answer")


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSONL file; a malformed line stops with its file and line number."""
    path = Path(path).expanduser()
    pairs = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise DataFormatError(f"{path}:{number}: not JSON ({error})") from None
            pairs.append(_pair(record, f"{path}:{number}"))
    if not pairs:
        raise DataFormatError(f"{path}: no pairs in it")
    return pairs


def task_pairs(task: TextTask) -> list[Pair]:
    """A text task's training split as pairs: the prompt it evaluates with (no shots), its reference answer."""
    return [Pair([{"role": "user", "content": task.format_prompt(doc, [])}], task.reference(doc))
            for doc in task.docs("train")]


def held_out(pairs: int, val_examples: int) -> int:
    """How many of `pairs` training pairs are held out for validation: `val_examples`, at most a fifth of them (at
    least one), so that a small file still trains on most of its pairs."""
    return min(val_examples, max(1, pairs // HOLD_OUT_SHARE))

"""GSM8K (Cobbe et al., 2021): grade-school math word problems scored on the final number.

Two prompt styles: `eb` (the EB-Sampler paper's set-up: 8-shot, each exemplar's worked solution ending in
"The answer is N." — the phrase that is also its generate_until stop) and `lm_eval` (lm-eval's `gsm8k` task:
5-shot "Question:/Answer:" with the raw "#### N" solutions, stopping at the next "Question:").
Exemplars are the first `shots` problems of the train split, as lm-eval's `first_n` sampler takes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from mdmkit.core.errors import ConfigError
from mdmkit.tasks.extraction import extract_gsm8k_answer
from mdmkit.tasks.text import HubSource, TextTask, Verdict

CALCULATOR = re.compile(r"<<[^>]*>>")  # the dataset's calculator annotations, e.g. <<48/2=24>>
_FINAL = re.compile(r"\n?####\s*(.+)\s*$")


def worked_solution(answer_field: str) -> str:
    """A gold solution as prose ending in "The answer is N." (calculator annotations removed)."""
    body = CALCULATOR.sub("", answer_field)
    match = _FINAL.search(body)
    if match is None:
        raise ConfigError(f"a GSM8K solution without '#### N': {answer_field[-60:]!r}")
    steps = " ".join(line.strip() for line in body[: match.start()].splitlines() if line.strip())
    return f"{steps} The answer is {match.group(1).strip()}."


@dataclass
class GSM8KTask(TextTask):
    name = "gsm8k"
    fields = ("question", "answer")
    source = HubSource("openai/gsm8k", "main", {"test": "test", "train": "train"},
                       {"test": "gsm8k_test.jsonl", "train": "gsm8k_train.jsonl"})

    shots: int = 8
    max_gen_len: int = 256
    style: Literal["eb", "lm_eval"] = "eb"

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "style": self.style}

    def fewshot_docs(self) -> list[dict]:
        return self.docs("train")[: self.shots] if self.shots else []

    def _shot(self, doc: dict) -> str:
        return f"Question: {doc['question']}\nAnswer: {self.reference(doc)}"

    def reference(self, doc: dict) -> str:
        return worked_solution(doc["answer"]) if self.style == "eb" else doc["answer"]

    def format_prompt(self, doc: dict, fewshot: list[dict]) -> str:
        return "".join(self._shot(shot) + "\n\n" for shot in fewshot) + f"Question: {doc['question']}\nAnswer:"

    def score(self, docs: list[dict], generations: list[str]) -> list[Verdict]:
        verdicts = []
        for doc, text in zip(docs, generations):
            predicted, gold = extract_gsm8k_answer(text), extract_gsm8k_answer(doc["answer"])
            verdicts.append(Verdict(predicted is not None and predicted == gold, f"predicted {predicted}, gold {gold}"))
        return verdicts

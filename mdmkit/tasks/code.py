"""HumanEval and MBPP: the model writes Python, the project's sandbox runs it against the tests.

Scoring executes untrusted code, so it refuses to run unless `MDMKIT_ALLOW_CODE_EXECUTION=1` (see
`mdmkit.sandbox` and docs/sandbox.md). Each solution runs in its own sandbox while the dataset's asserts run
here, calling into it, so a crash or hang fails only its task and no program can fake a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mdmkit.core.config import require
from mdmkit.sandbox import Check, SandboxLimits, backend_for, run_many
from mdmkit.tasks.extraction import extract_code, humaneval_check, mbpp_check
from mdmkit.tasks.text import HubSource, TextTask, Verdict


@dataclass
class CodeTask(TextTask):
    sandbox_timeout_s: float = 10.0
    sandbox_memory_mb: int = 1024
    sandbox_workers: int = 2

    def validate(self) -> None:
        super().validate()
        require(self.sandbox_workers >= 1, f"sandbox_workers={self.sandbox_workers} must be >= 1")
        self._limits()  # range checks

    def program(self, doc: dict, generation: str) -> Check:
        raise NotImplementedError

    def _limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=self.sandbox_timeout_s, memory_mb=self.sandbox_memory_mb)

    def check_can_score(self) -> None:
        backend_for(self._limits())  # the opt-in, and bwrap where it is asked for or needed (a GPU node)

    def score(self, docs: list[dict], generations: list[str]) -> list[Verdict]:
        programs = [self.program(doc, text) for doc, text in zip(docs, generations)]
        results = run_many(programs, self._limits(), workers=self.sandbox_workers, progress=len(programs) > 20)
        return [Verdict(r.passed, r.status if r.passed else f"{r.status}: {r.reason}") for r in results]


@dataclass
class HumanEvalTask(CodeTask):
    """HumanEval (Chen et al., 2021), 0-shot: the prompt is the function signature and docstring."""

    name = "humaneval"
    fields = ("task_id", "prompt", "entry_point", "test")
    source = HubSource("openai/openai_humaneval", None, {"test": "test"}, {"test": "HumanEval.jsonl.gz"})

    shots: int = 0
    max_gen_len: int = 512

    def validate(self) -> None:
        super().validate()
        require(self.shots == 0, f"shots={self.shots}: HumanEval has no exemplar split; it is 0-shot")

    def format_prompt(self, doc: dict, fewshot: list[dict]) -> str:
        return doc["prompt"]

    def program(self, doc: dict, generation: str) -> Check:
        completion = extract_code(generation, doc["prompt"], doc["entry_point"])
        return humaneval_check(doc["prompt"], completion, doc["entry_point"], doc["test"])


# MBPP's split of the original release by task id: exemplars ("prompt") 1-10, test 11-510, validation 511-600.
MBPP_SPLITS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601), "train": range(601, 975)}


@dataclass
class MBPPTask(CodeTask):
    """MBPP (Austin et al., 2021) with the [BEGIN]/[DONE] prompt; exemplars by task id from the prompt split.

    EB paper: 4-shot (ids 2-5); lm-eval's `mbpp`: 3-shot (ids 2-4, the original paper's choice).
    """

    name = "mbpp"
    fields = ("task_id", "text", "test_list")
    source = HubSource("google-research-datasets/mbpp", "full",
                       {"test": "test", "prompt": "prompt", "validation": "validation", "train": "train"},
                       {split: "mbpp.jsonl" for split in MBPP_SPLITS})

    shots: int = 4
    max_gen_len: int = 512
    fewshot_ids: list[int] = field(default_factory=lambda: [2, 3, 4, 5])

    def validate(self) -> None:
        super().validate()
        require(len(self.fewshot_ids) >= self.shots, f"shots={self.shots} but only {len(self.fewshot_ids)} "
                                                     "fewshot_ids")
        require(all(i in MBPP_SPLITS["prompt"] for i in self.fewshot_ids), "fewshot_ids must lie in 1..10 "
                                                                          "(the prompt split)")

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "fewshot_ids": list(self.fewshot_ids[: self.shots])}

    def post_filter(self, docs: list[dict], split: str) -> list[dict]:
        # The local file is the whole release: keep the split's id range (hub splits already are).
        ids = MBPP_SPLITS[split]
        return sorted((d for d in docs if d["task_id"] in ids), key=lambda d: d["task_id"])

    def fewshot_docs(self) -> list[dict]:
        by_id = {d["task_id"]: d for d in self.docs("prompt")}
        return [by_id[i] for i in self.fewshot_ids[: self.shots]]

    @staticmethod
    def _question(doc: dict) -> str:
        tests = "\n".join(doc["test_list"])
        return (f"You are an expert Python programmer, and here is your task: {doc['text']} "
                f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n")

    def format_prompt(self, doc: dict, fewshot: list[dict]) -> str:
        shots = "".join(self._question(d) + d["code"].replace("\r\n", "\n") + "\n[DONE]\n\n" for d in fewshot)
        return shots + self._question(doc)

    def program(self, doc: dict, generation: str) -> Check:
        setup, reference = doc.get("test_setup_code", ""), doc.get("code")
        return mbpp_check(extract_code(generation), doc["test_list"], setup, reference)

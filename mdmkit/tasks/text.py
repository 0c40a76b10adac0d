"""The text-benchmark interface: documents in, prompts out, generations scored.

Unlike the puzzle tasks, a text task does not tokenize: prompts are strings, so the same task runs on any
tokenizer (LLaDA's, Dream's, a tiny test one) and through lm-eval. Documents load through `datasets`, by hub
name by default or from local files (`data_dir` with the benchmark's usual file names, or `data_files`), so a
machine without network evaluates on its own copy of the data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mdmkit.core.config import Validated, require
from mdmkit.core.errors import DataFormatError
from mdmkit.tasks.extraction import STOP_PHRASES
from mdmkit.tasks.hub_access import cached, hub_unreachable, load_from_cache


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub, and its usual local file names."""

    path: str
    name: str | None
    splits: dict[str, str]  # our split name -> hub split name
    local_files: dict[str, str]  # our split name -> file name inside `data_dir`


@dataclass(frozen=True)
class Verdict:
    """One generation's score and what decided it (the extracted answer, the sandbox's reason)."""

    correct: bool
    detail: str = ""


@dataclass
class TextTask(Validated):
    """Base class of GSM8K / HumanEval / MBPP: loading, few-shot prompt assembly, stop phrases, scoring."""

    name: ClassVar[str]
    source: ClassVar[HubSource]
    fields: ClassVar[tuple[str, ...]] = ()  # what every document must hold (a local file is checked on loading)

    shots: int = 0
    max_gen_len: int = 256
    stop_family: str = "llada"  # whose generate_until phrases to use (EB paper Table 2): llada | dream
    stop: list[str] | None = None  # explicit stop phrases (override stop_family)
    chat: bool = False  # wrap the prompt in the tokenizer's chat template (instruct models)
    data_dir: str | None = None  # local directory holding the benchmark's usual files (no network)
    data_files: dict[str, str] | None = None  # or explicit files per split, e.g. {test: ..., train: ...}
    limit: int | None = None  # first N test documents only

    _docs: dict[str, list[dict]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def validate(self) -> None:
        require(self.shots >= 0, f"shots={self.shots} must be >= 0")
        require(self.max_gen_len >= 1, f"max_gen_len={self.max_gen_len} must be >= 1")
        require(self.stop_family in STOP_PHRASES, f"stop_family={self.stop_family} must be one of "
                                                  f"{', '.join(STOP_PHRASES)}")
        require(self.stop is None or (len(self.stop) > 0 and all(self.stop)), "stop must be non-empty phrases")
        require(self.limit is None or self.limit >= 1, f"limit={self.limit} must be >= 1 or null")
        require(self.data_dir is None or Path(self.data_dir).expanduser().is_dir(),
                f"data_dir={self.data_dir} is not a directory")
        for split, path in (self.data_files or {}).items():
            require(Path(path).expanduser().is_file(), f"data_files.{split}={path} does not exist")

    # -- what each benchmark defines ------------------------------------------------------------
    def format_prompt(self, doc: dict, fewshot: list[dict]) -> str:
        raise NotImplementedError

    def score(self, docs: list[dict], generations: list[str]) -> list[Verdict]:
        """Whether each (already stop-truncated) generation solves its document, and why."""
        raise NotImplementedError

    def reference(self, doc: dict) -> str:
        """The gold answer as the model should write it after `format_prompt` (the target of fine-tuning)."""
        raise DataFormatError(f"{self.name} names no reference answer to fine-tune on: give the pairs in a JSONL "
                              "file (sft.train_file)")

    def check_can_score(self) -> None:
        """Raise before any generation if `score` could not run here, so no generation is made in vain."""

    def fewshot_docs(self) -> list[dict]:
        return []

    def post_filter(self, docs: list[dict], split: str) -> list[dict]:
        """Hook for benchmarks whose splits are ranges of one file (MBPP)."""
        return docs

    # -- shared machinery ---------------------------------------------------------------------
    @property
    def stop_phrases(self) -> list[str]:
        return list(self.stop if self.stop is not None else STOP_PHRASES[self.stop_family][self.name])

    def docs(self, split: str = "test") -> list[dict]:
        """The split's documents (loaded once), the test split cut to `limit`."""
        if split not in self._docs:
            self._docs[split] = self.post_filter(self._load(split), split)
        docs = self._docs[split]
        return docs[: self.limit] if split == "test" and self.limit is not None else docs

    def _files(self) -> dict[str, str] | None:
        if self.data_files is not None:
            return {k: str(Path(v).expanduser()) for k, v in self.data_files.items()}
        if self.data_dir is not None:
            root = Path(self.data_dir).expanduser()
            return {split: str(root / name) for split, name in self.source.local_files.items()}
        return None

    def source_of(self, split: str, fix: str) -> str:
        """Where `split` will load from, told without loading it: its local file, the hub, or the datasets cache
        where the hub cannot be reached. A missing file, or the hub out of reach with nothing cached, is one line
        ending in `fix` (the setting that gives the documents another way)."""
        files = self._files()
        if files is not None:
            path = files.get(split)
            if path is None or not Path(path).is_file():
                raise DataFormatError(f"{self.name}: no local file for the {split} split "
                                      f"({path or f'data_files has only {sorted(files)}'} does not exist): {fix}")
            return path
        offline = hub_unreachable()
        if offline is None:
            return f"the hub ({self.source.path})"
        if cached(self.source.path):
            load_from_cache()
            return f"the datasets cache ({self.source.path}; {offline})"
        raise DataFormatError(f"{self.name}: its {split} split is on the hub ({self.source.path}), but {offline}: "
                              f"{fix}")

    def _load(self, split: str) -> list[dict]:
        import datasets
        from datasets.exceptions import DatasetsError

        files = self._files()
        if files is not None and (split not in files or not Path(files[split]).is_file()):
            raise DataFormatError(f"{self.name}: no local file for the {split} split: "
                                  f"{files.get(split, f'data_files has only {sorted(files)}')} does not exist")
        try:
            if files is not None:
                data = datasets.load_dataset("json", data_files={split: files[split]}, split=split)
            else:
                data = datasets.load_dataset(self.source.path, self.source.name, split=self.source.splits[split])
        except (FileNotFoundError, ConnectionError, ValueError, DatasetsError) as error:
            cause = f"{error}: {error.__cause__}" if isinstance(error, DatasetsError) and error.__cause__ else error
            if files is not None:
                raise DataFormatError(f"{self.name}: cannot load the {split} split from {files[split]}: {cause}")
            raise DataFormatError(f"{self.name}: cannot load the {split} split from the hub ({self.source.path}): "
                                  f"{cause}. Offline, point task.data_dir at a directory with "
                                  f"{sorted(self.source.local_files.values())}")
        docs = [dict(row) for row in data]
        for number, doc in enumerate(docs, 1):
            missing = [name for name in self.fields if name not in doc or doc[name] is None]
            if missing:
                where = files[split] if files is not None else f"the hub ({self.source.path})"
                raise DataFormatError(f"{self.name}: {where}: document {number} of the {split} split has no "
                                      f"{', '.join(missing)} (each needs {', '.join(self.fields)})")
        return docs

    def prompts(self) -> list[str]:
        fewshot = self.fewshot_docs()
        return [self.format_prompt(doc, fewshot) for doc in self.docs("test")]

    def settings(self) -> dict[str, Any]:
        """What determines the prompts and generations beside the documents (benchmarks add their own)."""
        return {"shots": self.shots, "max_gen_len": self.max_gen_len, "stop": self.stop_phrases, "chat": self.chat}

    def fingerprint(self) -> str:
        """Prompts and stop phrases determine the measurement; a hash of them keys results rows."""
        spec = {"task": self.name, **self.settings(), "prompts": hashlib.sha256(
            "\x00".join(self.prompts()).encode()).hexdigest()}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

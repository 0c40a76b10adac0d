"""The puzzle-task interface: make (or load) data once, cache it under a fingerprint, split it disjointly.

A task turns each example into a fixed-length token sequence plus an `answer_mask` (True where the model
must infill). Everything else (prompt/given positions) is context that is never masked and never scored.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from mdmkit.core.config import Validated, require
from mdmkit.core.errors import DataFormatError
from mdmkit.core.stopping import StopCondition

SPLITS = ("train", "val", "test")


@dataclass
class Examples:
    """A batch of task examples as arrays: tokens [N, L] (complete answers), answer_mask [N, L], keys [N]."""

    tokens: np.ndarray
    answer_mask: np.ndarray
    keys: np.ndarray  # one bytes digest per example, invariant to serialization choices

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, index: np.ndarray | slice) -> Examples:
        return Examples(self.tokens[index], self.answer_mask[index], self.keys[index])

    @staticmethod
    def concat(parts: list[Examples]) -> Examples:
        return Examples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("tokens", "answer_mask", "keys")))


@dataclass
class Split:
    """One split as tensors, ready for data loaders and samplers."""

    tokens: torch.Tensor
    answer_mask: torch.Tensor
    keys: np.ndarray

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def head(self, n: int | None) -> Split:
        """The first n examples (all of them for None)."""
        return self if n is None else Split(self.tokens[:n], self.answer_mask[:n], self.keys[:n])

    @classmethod
    def from_examples(cls, examples: Examples) -> Split:
        return cls(
            torch.from_numpy(examples.tokens.astype(np.int64)),
            torch.from_numpy(examples.answer_mask.astype(bool)),
            examples.keys,
        )


def assert_disjoint(splits: dict[str, Split]) -> None:
    """Fail loudly if any example appears in two splits (compared by content hash)."""
    seen: dict[bytes, str] = {}
    for name, split in splits.items():
        for key in split.keys.tolist():
            if key in seen and seen[key] != name:
                raise DataFormatError(f"an example appears in both the {seen[key]} and {name} splits")
            seen[key] = name


def digest(*parts: bytes) -> bytes:
    return hashlib.sha1(b"|".join(parts)).digest()


@dataclass
class PuzzleTask(Validated):
    """Base class for generated puzzle tasks (Sudoku, maze)."""

    name: ClassVar[str]
    generator_version: ClassVar[int] = 1  # bump when generation changes, so old caches are not reused

    n_train: int = 100_000
    n_val: int = 1_000
    n_test: int = 1_000
    seed: int = 0
    cache_dir: str = "~/.cache/mdmkit"
    test_file: str | None = None  # evaluate on puzzles from a file instead of the generated test split
    workers: int = 1

    def validate(self) -> None:
        require(self.n_train >= 1, f"n_train={self.n_train} must be >= 1")
        require(self.n_val >= 1 and self.n_test >= 1, "n_val and n_test must be >= 1")
        require(self.workers >= 1, f"workers={self.workers} must be >= 1")
        if self.test_file is not None:
            require(Path(self.test_file).expanduser().is_file(), f"test_file={self.test_file} does not exist")

    # -- what each task defines ---------------------------------------------------------------
    @property
    def vocab(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        raise NotImplementedError

    def settings(self) -> dict:
        """The settings that determine the generated data (the cache fingerprint)."""
        raise NotImplementedError

    def generate(self, count: int, seed: int) -> Examples:
        raise NotImplementedError

    def read_file(self, path: Path) -> Examples:
        raise NotImplementedError

    def score(self, predicted: torch.Tensor, target: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """Bool [B]: whether each predicted sequence solves its puzzle."""
        raise NotImplementedError

    def sample_metrics(self, predicted: torch.Tensor) -> dict[str, Any]:
        """Quality measures of a whole split's samples beyond accuracy (text: spelling, entropy); none here."""
        return {}

    def stop_condition(self) -> StopCondition | None:
        """generate_until for tasks whose answers end early (an end token): samplers may stop there."""
        return None

    # -- shared machinery ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def mask_id(self) -> int:
        return self.vocab.index("[MASK]")

    def decode(self, tokens: torch.Tensor | np.ndarray) -> str:
        return " ".join(self.vocab[int(t)] for t in tokens)

    def fingerprint(self) -> str:
        spec = {"task": self.name, "version": self.generator_version, "seed": self.seed, **self.settings()}
        spec.update(n_train=self.n_train, n_val=self.n_val, n_test=self.n_test)
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() / f"{self.name}-{self.fingerprint()}.npz"

    def _generate_unique(self, total: int) -> Examples:
        """Generate `total` distinct examples; test comes first so it is stable when n_train changes."""
        parts, seen, have, round_ = [], set(), 0, 0
        while have < total:
            batch = self.generate(total - have if round_ else total, self.seed + 1_000_003 * round_)
            keep = np.array([k not in seen and not seen.add(k) for k in batch.keys.tolist()], dtype=bool)
            parts.append(batch.take(keep))
            have += int(keep.sum())
            round_ += 1
            require(round_ < 20, f"{self.name}: cannot find {total} distinct examples; the puzzle space is too small")
        return Examples.concat(parts).take(slice(0, total))

    def load_splits(self) -> dict[str, Split]:
        """Generated (or cached) train/val/test splits, checked disjoint; `test_file` replaces test."""
        path = self.cache_path()
        if path.exists():
            with np.load(path) as cached:
                examples = Examples(cached["tokens"], cached["answer_mask"], cached["keys"])
        else:
            examples = self._generate_unique(self.n_test + self.n_val + self.n_train)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(tmp, tokens=examples.tokens, answer_mask=examples.answer_mask, keys=examples.keys)
            tmp.replace(path)
        bounds = np.cumsum([0, self.n_test, self.n_val, self.n_train])
        test, val, train = (examples.take(slice(a, b)) for a, b in zip(bounds[:-1], bounds[1:]))
        if self.test_file is not None:
            test = self.read_file(Path(self.test_file).expanduser())
        splits = {name: Split.from_examples(ex) for name, ex in zip(SPLITS, (train, val, test))}
        assert_disjoint(splits)
        return splits

"""The puzzle-task interface: make (or load) data once, cache it under a fingerprint, split it disjointly.

A task turns each example into a fixed-length token sequence plus an `answer_mask` (True where the model
must infill). Everything else (prompt/given positions) is context that is never masked and never scored.
"""

from __future__ import annotations

import hashlib
import itertools
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

    def fingerprint(self) -> str:
        """Names these examples in this order, whatever made them: rows with the same fingerprint can be
        compared example by example."""
        return hashlib.sha256(b"".join(self.keys.tolist())).hexdigest()[:16]

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


def pack_tokens(examples: Examples) -> dict[str, np.ndarray]:
    """Examples as cache arrays, one byte per token where the vocabulary allows (compact enough to carry a
    paper-scale split to a remote machine); `Split.from_examples` widens tokens back to int64."""
    tokens = examples.tokens
    if tokens.size and 0 <= tokens.min() and tokens.max() < 256:
        tokens = tokens.astype(np.uint8)
    return {"tokens": tokens, "answer_mask": examples.answer_mask, "keys": examples.keys}


def default_cache_dir() -> str:
    """Where generated data are cached unless a config says otherwise: $MDMKIT_CACHE_DIR, else ~/.cache/mdmkit."""
    return os.environ.get("MDMKIT_CACHE_DIR", "~/.cache/mdmkit")


@dataclass
class PuzzleTask(Validated):
    """Base class for generated tasks (Sudoku, maze, arithmetic, character text): splits made once and cached."""

    name: ClassVar[str]
    generator_version: ClassVar[int] = 1  # bump when generation changes, so old caches are not reused
    # generate(m, seed) is the first m examples of generate(n, seed) for every m <= n: the test split, the head of
    # `_generate_unique`'s first round, can then be made without train and val (`load_test`)
    stable_prefix: ClassVar[bool] = False
    # what `augment` draws from (data.augment=true), in words; None: the task defines no symmetries
    symmetries: ClassVar[str | None] = None
    parallel_generation: ClassVar[bool] = False  # whether `workers` > 1 spreads generation over processes

    n_train: int = 100_000
    n_val: int = 1_000
    n_test: int = 1_000
    seed: int = 0
    cache_dir: str | None = None  # None: default_cache_dir(), resolved when the task is made
    test_file: str | None = None  # evaluate on puzzles from a file instead of the generated test split
    workers: int = 1  # processes that generate the splits where the task can (`parallel_generation`); data is the same

    def __post_init__(self) -> None:
        if self.cache_dir is None:
            object.__setattr__(self, "cache_dir", default_cache_dir())
        super().__post_init__()

    def validate(self) -> None:
        require(self.n_train >= 1, f"n_train={self.n_train} must be >= 1")
        require(self.n_val >= 1 and self.n_test >= 1, "n_val and n_test must be >= 1")
        require(self.workers >= 1, f"workers={self.workers} must be >= 1")
        require(self.workers == 1 or self.parallel_generation,
                f"workers={self.workers}: task {self.name} generates its data in one process")
        if self.test_file is not None:
            require(type(self).read_file is not PuzzleTask.read_file, f"task {self.name} reads no test_file")
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

    def augment(self, tokens: torch.Tensor, answer_mask: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Training examples ([B, L] complete answers and their answer masks) each under a random symmetry that
        keeps it a valid example of the same difficulty; tasks with `symmetries` define it."""
        raise NotImplementedError(f"task {self.name} defines no symmetries")

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
        assert self.cache_dir is not None, "resolved by __post_init__"
        return Path(self.cache_dir).expanduser() / f"{self.name}-{self.fingerprint()}.npz"

    def _generate_unique(self, total: int) -> Examples:
        """Generate `total` distinct examples; test comes first so it is stable when n_train changes."""
        parts: list[Examples] = []
        seen: set[object] = set()
        have, round_ = 0, 0
        while have < total:
            batch = self.generate(total - have if round_ else total, self.seed + 1_000_003 * round_)
            keys = batch.keys.tolist()
            keep = np.zeros(len(keys), dtype=bool)
            for i, key in enumerate(keys):
                keep[i] = key not in seen
                seen.add(key)
            parts.append(batch.take(keep))
            have += int(keep.sum())
            round_ += 1
            # under 1% new in a round of 1000+ draws: the 20 rounds allowed could not make up what is missing
            exhausted = round_ > 1 and len(keep) >= 1000 and keep.sum() < 0.01 * len(keep)
            require(have >= total or (round_ < 20 and not exhausted),
                    f"{self.name}: found {have} distinct examples of the {total} asked for (test, validation and "
                    f"n_train={self.n_train}); the puzzle space is too small: lower task.n_train")
        return Examples.concat(parts).take(slice(0, total))

    def _read_test_file(self) -> Examples | None:
        """The examples of `test_file` (None without one), read before anything is generated: a malformed file
        fails in a second, not after the whole dataset has been made."""
        if self.test_file is None:
            return None
        path = Path(self.test_file).expanduser()
        try:
            examples = self.read_file(path)
        except UnicodeDecodeError as error:
            raise DataFormatError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        repeats = len(examples.keys) - len(set(examples.keys.tolist()))
        if repeats:  # each would count twice in the accuracy
            raise DataFormatError(f"{path}: {repeats} of its {len(examples.keys)} examples repeat an earlier one")
        return examples

    def pack(self, examples: Examples) -> dict[str, np.ndarray]:
        """The arrays a cache file stores; tasks with a tighter code than `pack_tokens` override this and
        `unpack`, which inverts it."""
        return pack_tokens(examples)

    def unpack(self, arrays: dict[str, np.ndarray]) -> Examples:
        return Examples(arrays["tokens"], arrays["answer_mask"], arrays["keys"])

    def _read_cache(self, path: Path, rows: slice = slice(None)) -> Examples:
        """The cached examples; only `rows` of them are unpacked (the test split heads a full cache)."""
        with np.load(path) as cached:
            arrays = {name: cached[name][rows] for name in cached.files}
        try:
            return self.unpack(arrays)
        except DataFormatError as error:
            raise DataFormatError(f"{path}: {error} (another layout: delete the file and it is made again)") from None

    def _write_cache(self, path: Path, examples: Examples) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # concurrent writers (ranks, jobs) each replace it whole
        np.savez_compressed(tmp, **self.pack(examples))  # type: ignore[arg-type]  # array names, no allow_pickle
        tmp.replace(path)

    def load_splits(self) -> dict[str, Split]:
        """Generated (or cached) train/val/test splits, checked disjoint; `test_file` replaces test."""
        from_file = self._read_test_file()
        path = self.cache_path()
        if path.exists():
            examples = self._read_cache(path)
        else:
            examples = self._generate_unique(self.n_test + self.n_val + self.n_train)
            self._write_cache(path, examples)
        bounds = np.cumsum([0, self.n_test, self.n_val, self.n_train])
        test, val, train = (examples.take(slice(a, b)) for a, b in itertools.pairwise(bounds))
        if from_file is not None:
            test = from_file
        splits = {name: Split.from_examples(ex) for name, ex in zip(SPLITS, (train, val, test))}
        assert_disjoint(splits)
        return splits

    # -- the test split alone (evaluation) ----------------------------------------------------------
    def test_cache_path(self) -> Path:
        """Where the test split made alone is cached (beside the full cache, under the same fingerprint)."""
        return self.cache_path().with_suffix(".test.npz")

    def _generate_test(self) -> Examples | None:
        """The first `n_test` distinct examples of `_generate_unique`'s first round, generating a head of that
        round only (doubled until it holds enough); None where the first round itself has too few."""
        total, count = self.n_test + self.n_val + self.n_train, self.n_test
        while True:
            batch = self.generate(count, self.seed)
            first = np.sort(np.unique(batch.keys, return_index=True)[1])  # keep-first, as `_generate_unique`
            if len(first) >= self.n_test:
                return batch.take(first[: self.n_test])
            if count >= total:
                return None
            count = min(total, 2 * count)

    def load_test(self) -> Split:
        """`load_splits()["test"]` without making train and val where it can, for evaluation: `test_file` (checked
        against the cached train and val where they are cached), else the full cache's test split, else the
        test-only cache, else the test split generated alone (tasks with `stable_prefix`), else `load_splits`."""
        from_file = self._read_test_file()
        full = self.cache_path()
        if from_file is not None:
            test = Split.from_examples(from_file)
            if full.exists():  # a file of training examples would measure memory: the check of load_splits
                seen = set(self._read_cache(full).keys[self.n_test :].tolist())
                if any(key in seen for key in test.keys.tolist()):
                    raise DataFormatError("an example appears in both the train/val and test splits "
                                          f"(test_file={self.test_file})")
            return test
        if full.exists():
            return Split.from_examples(self._read_cache(full, slice(0, self.n_test)))
        alone = self.test_cache_path()
        if alone.exists():
            return Split.from_examples(self._read_cache(alone))
        generated = self._generate_test() if self.stable_prefix else None
        if generated is None:
            return self.load_splits()["test"]
        self._write_cache(alone, generated)
        return Split.from_examples(generated)

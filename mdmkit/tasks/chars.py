"""Character-level text from the GSM8K training problems, for unconditional generation.

The self-speculative paper measures text samples on text8 by *spelling accuracy* (§5.1, App. E.1): the
share of generated words that occur in the training text, a word being the lowercase characters between two
whitespace characters. Low-temperature collapse can pass that test with a few common words, so the
per-sample *unigram entropy* of the characters is reported beside it (App. E.2).

The corpus is every train problem (question, then its solution without calculator annotations), lowercased and
reduced to a small alphabet. Examples are windows of `length` characters at random offsets; every position is
an answer position, so the "test split" is only a number of canvases to generate from scratch.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from mdmkit.core.config import require
from mdmkit.tasks.base import Examples, PuzzleTask, digest
from mdmkit.tasks.gsm8k import CALCULATOR, GSM8KTask

ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,?!$%'+-*/=:()"
_WORD = re.compile(r"[a-z]+")
_EDGE_PUNCTUATION = ".,?!:;'\"()$%"


def normalize(text: str) -> str:
    """Lowercase, calculator annotations and characters outside ALPHABET dropped, whitespace collapsed."""
    text = CALCULATOR.sub("", text).replace("####", "answer:").lower()
    text = "".join(c for c in re.sub(r"\s+", " ", text) if c in ALPHABET)
    return re.sub(" +", " ", text).strip()


def words(text: str, interior: bool = False) -> list[str]:
    """The words of `text`: whitespace-separated pieces that are lowercase letters once edge punctuation is
    stripped. `interior` drops the first and last piece, which a window may have cut in two."""
    pieces = text.split(" ")
    if interior:
        pieces = pieces[1:-1]
    stripped = (piece.strip(_EDGE_PUNCTUATION) for piece in pieces)
    return [word for word in stripped if _WORD.fullmatch(word)]


def unigram_entropy(text: str) -> float:
    """Entropy (nats) of the character histogram of one sample."""
    counts = np.array(list(Counter(text).values()), dtype=float)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


@dataclass
class CharTextTask(PuzzleTask):
    """Windows of `length` characters of the GSM8K train problems (local files via `data_dir`, else hub)."""

    name = "gsm8k_chars"

    length: int = 128
    data_dir: str | None = None
    n_train: int = 200_000
    n_val: int = 512
    n_test: int = 1024
    stable_prefix = True  # window starts are one stream of draws: evaluation makes the test split alone

    def validate(self) -> None:
        super().validate()
        require(8 <= self.length <= 4096, f"length={self.length} must lie in [8, 4096]")

    @cached_property
    def corpus(self) -> str:
        docs = GSM8KTask(data_dir=self.data_dir).docs("train")
        text = " ".join(normalize(f"{doc['question']} {doc['answer']}") for doc in docs)
        require(len(text) > 10 * self.length,
                f"the corpus ({len(text)} characters) is too short for length {self.length}")
        return text

    @cached_property
    def dictionary(self) -> frozenset[str]:
        return frozenset(words(self.corpus))

    @property
    def vocab(self) -> tuple[str, ...]:
        return (*ALPHABET, "[MASK]")

    @property
    def seq_len(self) -> int:
        return self.length

    def settings(self) -> dict:
        return {"length": self.length, "corpus": hashlib.sha256(self.corpus.encode()).hexdigest()[:16]}

    def encode(self, text: str) -> np.ndarray:
        return np.array([ALPHABET.index(c) for c in text], dtype=np.int64)

    def decode(self, tokens: torch.Tensor | np.ndarray) -> str:
        return "".join(self.vocab[int(t)] if int(t) < len(ALPHABET) else "_" for t in tokens)

    def generate(self, count: int, seed: int) -> Examples:
        corpus = self.encode(self.corpus)
        starts = np.random.default_rng(seed).integers(0, len(corpus) - self.length, size=count)
        tokens = corpus[starts[:, None] + np.arange(self.length)]
        keys = np.array([digest(row.astype(np.int8).tobytes()) for row in tokens], dtype="S20")
        return Examples(tokens, np.ones_like(tokens, dtype=bool), keys)

    def score(self, predicted: torch.Tensor, target: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """Per sample: it has a complete word and every complete word occurs in the training text."""
        verdicts = []
        for row in predicted.cpu():
            found = words(self.decode(row), interior=True)
            verdicts.append(bool(found) and all(word in self.dictionary for word in found))
        return torch.tensor(verdicts, dtype=torch.bool)

    def sample_metrics(self, predicted: torch.Tensor) -> dict[str, Any]:
        """Spelling accuracy pooled over every complete word of every sample (App. E.1) and the mean unigram
        entropy per sample (App. E.2)."""
        texts = [self.decode(row) for row in predicted.cpu()]
        found = [word for text in texts for word in words(text, interior=True)]
        spelled = sum(word in self.dictionary for word in found)
        return {
            "spelling_accuracy": spelled / len(found) if found else None,  # no complete word: undefined
            "unigram_entropy": float(np.mean([unigram_entropy(text) for text in texts])),
            "words": len(found),
        }

"""generate_until: a row is finished once a stop sequence is revealed and everything before it is too.

This is the EB-Sampler paper's criterion (§6.1.1): the text up to the stop phrase can no longer change, so
sampling the rest would only cost forward passes whose output is cut away.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


def settled_answer(tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Bool [R, L]: the answer positions before the row's first masked one (text that can no longer change)."""
    masked = answer & (tokens == mask_id)
    return answer & (masked.long().cumsum(1) == 0)


@dataclass(frozen=True)
class StopCondition:
    """Stop sequences as token ids (a single stop token is a sequence of length one)."""

    sequences: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int] | int]) -> StopCondition:
        seqs = tuple((s,) if isinstance(s, int) else tuple(int(t) for t in s) for s in sequences)
        if not seqs or any(len(s) == 0 for s in seqs):
            raise ValueError("stop sequences must be non-empty")
        return cls(seqs)

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        """Bool [R]: a stop sequence starts inside the answer region with every answer position before it revealed."""
        settled = settled_answer(tokens, answer, mask_id)  # a match starts at a revealed position
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for seq in self.sequences:
            width = len(seq)
            if width > tokens.shape[1]:
                continue
            target = torch.tensor(seq, device=tokens.device)
            match = (tokens.unfold(1, width, 1) == target).all(-1)
            done |= (match & settled[:, : match.shape[1]]).any(1)
        return done


@dataclass(frozen=True)
class TextStop:
    """generate_until on decoded text: a row is finished once its settled answer prefix contains a stop phrase.

    Token-sequence matching misses stop phrases that tokenize differently in context ("\\n\\n\\n" can merge with
    its neighbours) and cannot express templates such as GSM8K's "The answer is %d."; decoding the settled prefix
    (the answer positions before the first mask) and matching text handles both. `decode` maps token ids to text.
    """

    phrases: tuple[str, ...]
    decode: Callable[[list[int]], str]

    def __post_init__(self) -> None:
        if not self.phrases or any(not p for p in self.phrases):
            raise ValueError("stop phrases must be non-empty strings")

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        settled = settled_answer(tokens, answer, mask_id)
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for row in range(tokens.shape[0]):
            text = self.decode(tokens[row][settled[row]].tolist())
            done[row] = find_stop(text, self.phrases) is not None
        return done


class Stop(Protocol):
    """A sampler's `stop`: `met` says which rows are finished (StopCondition, TextStop, AnyStop, ...)."""

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class AnswerBudget:
    """Finished once `length` answer tokens are settled. Rows of a causal batch differ in prompt length and
    share one canvas width, so shorter prompts are followed by more masks than they may generate."""

    length: int

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        return settled_answer(tokens, answer, mask_id).sum(1) >= self.length


@dataclass(frozen=True)
class AnyStop:
    """A row is finished once any of `conditions` is met (e.g. the end-of-text token or a stop phrase)."""

    conditions: tuple[Stop, ...]

    def met(self, tokens: torch.Tensor, answer: torch.Tensor, mask_id: int) -> torch.Tensor:
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for condition in self.conditions:
            done |= condition.met(tokens, answer, mask_id).to(done.device)
        return done


def _stop_regex(stop: str) -> re.Pattern[str]:
    """Regex for a stop phrase; "%d" becomes a (possibly signed, comma-grouped) integer."""
    parts = [re.escape(p) for p in stop.split("%d")]
    return re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)".join(parts))


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where text is cut by its earliest stop phrase (see `truncate_at_stop`), or None if none occurs."""
    cuts = []
    for stop in filter(None, stops):
        if "%d" in stop:
            match = _stop_regex(stop).search(text)
            cuts += [match.end()] if match else []
        elif (index := text.find(stop)) != -1:
            cuts.append(index)
    return min(cuts, default=None)

"""Prompt-response pairs for fine-tuning: read, rendered with the model's chat template, tokenized, batched.

An example is one row of `tokens` (prompt, answer, then EOS padding to the longest pair), its `answer_mask` (True
from the answer's first token on, padding included: LLaDA's SFT treats the EOS padding as answer, so the model
learns where its answer ends) and its `length` (prompt + answer). A training batch is cut to its longest pair, so
a batch pads only as far as LLaDA's per-batch padding does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from mdmkit.core.errors import DataFormatError
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.tasks.text import TextTask
from mdmkit.training.datamodule import step_indexed_loader
from mdmkit.training.sft.config import SFTConfig

Messages = list[dict[str, str]]
NOISE_SEEDS = 2**62  # a batch's masking noise is drawn from a generator seeded below this


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


@dataclass
class Examples:
    tokens: torch.Tensor  # [N, L] long
    answer_mask: torch.Tensor  # [N, L] bool
    lengths: torch.Tensor  # [N] prompt + answer tokens
    left_out: int = 0  # pairs longer than max_length

    def __len__(self) -> int:
        return len(self.tokens)

    def subset(self, rows: slice) -> Examples:
        """These rows, cut to the longest of them."""
        width = int(self.lengths[rows].max())
        return Examples(self.tokens[rows, :width], self.answer_mask[rows, :width], self.lengths[rows], self.left_out)


def _token_id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or (found == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise DataFormatError(f"end_of_turn={token!r} is not a token of the model's tokenizer")
    return int(found)


def encode(pairs: list[Pair], tokenizer: Any, config: SFTConfig) -> Examples:
    """Tokenize `pairs` as the model sees them: the prompt through the chat template (with the assistant's
    header), the answer, `end_of_turn` (or EOS), EOS padding. Pairs over `max_length` tokens are left out."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if eos is None:
        raise DataFormatError("the model's tokenizer has no EOS or padding token to pad answers with")
    closing = _token_id(tokenizer, config.end_of_turn) if config.end_of_turn is not None else eos
    rows, starts, left_out = [], [], 0
    for pair in pairs:
        if config.chat:
            text = tokenizer.apply_chat_template(pair.prompt, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(message["content"] for message in pair.prompt)
        prompt = list(tokenizer(text, add_special_tokens=not config.chat)["input_ids"])
        answer = list(tokenizer(pair.response, add_special_tokens=False)["input_ids"]) + [closing]
        if len(prompt) + len(answer) > config.max_length:
            left_out += 1
            continue
        rows.append(prompt + answer)
        starts.append(len(prompt))
    if not rows:
        raise DataFormatError(f"every pair is longer than max_length={config.max_length} tokens")
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), int(eos), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    answer_mask = torch.arange(width)[None] >= torch.tensor(starts)[:, None]
    return Examples(tokens, answer_mask, torch.tensor([len(row) for row in rows]), left_out)


def cut_to_longest(tokens: torch.Tensor, answer_mask: torch.Tensor, lengths: torch.Tensor,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A training batch cut to its longest pair, with the seed of its masking noise: drawn from the batch's own
    stream, so the noise follows the batch wherever (rank, accumulation step) it is trained."""
    width = int(lengths.max())
    seed = int(torch.randint(NOISE_SEEDS, (), generator=generator))
    return tokens[:, :width], answer_mask[:, :width], seed


class SFTDataModule(L.LightningDataModule):
    """Training batches drawn step by step (resumable, the same under any split over processes); validation over
    a fixed set of pairs, each batch with fixed noise."""

    def __init__(self, train: Examples, val: Examples, batch_size: int, eval_batch_size: int, seed: int,
                 workers: int = 0) -> None:
        super().__init__()
        self.train, self.val = train, val
        self.batch_size, self.eval_batch_size, self.seed, self.workers = batch_size, eval_batch_size, seed, workers

    def train_dataloader(self) -> DataLoader:
        return step_indexed_loader(self.trainer, (self.train.tokens, self.train.answer_mask, self.train.lengths),
                                   self.batch_size, self.seed, cut_to_longest, self.workers)

    def val_dataloader(self) -> DataLoader:
        size = self.eval_batch_size
        batches = []
        for index, start in enumerate(range(0, len(self.val), size)):
            part = self.val.subset(slice(start, start + size))
            noise = int(torch.randint(NOISE_SEEDS, (), generator=seeded_generator(stream_seed(self.seed, index))))
            batches.append((part.tokens, part.answer_mask, noise))
        return DataLoader(batches, batch_size=None)  # type: ignore[arg-type]  # a list: a map-style dataset


def split_examples(train: Examples, val: Examples | None, val_examples: int) -> tuple[Examples, Examples]:
    """The training and validation examples: `val` as given, or the last `val_examples` training ones held out."""
    if val is not None:
        return train, val.subset(slice(0, val_examples))
    if len(train) <= val_examples:
        raise DataFormatError(f"{len(train)} training pairs leave none to train on once data.val_examples="
                              f"{val_examples} are held out for validation: fewer val_examples, or give sft.val_file")
    return train.subset(slice(0, len(train) - val_examples)), train.subset(slice(len(train) - val_examples, None))

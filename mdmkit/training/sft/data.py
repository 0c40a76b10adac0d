"""Prompt-response pairs (pairs.py reads them) as a model trains on them: rendered with its chat template,
tokenized, batched.

An example is one row of `tokens` (prompt, answer, then EOS padding to the longest pair), its `answer_mask` (True
from the answer's first token on, padding included: LLaDA's SFT treats the EOS padding as answer, so the model
learns where its answer ends) and its `length` (prompt + answer). A training batch is cut to its longest pair, so
a batch pads only as far as LLaDA's per-batch padding does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from mdmkit.core.errors import DataFormatError
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.core.wording import plural
from mdmkit.training.datamodule import step_indexed_loader
from mdmkit.training.sft.config import SFTConfig
from mdmkit.training.sft.pairs import Pair, held_out

NOISE_SEEDS = 2**62  # a batch's masking noise is drawn from a generator seeded below this


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
    """The training and validation examples: `val` as given (its first `val_examples`), or the last training ones
    held out (`val_examples`, at most a fifth of them: `pairs.held_out`)."""
    if val is not None:
        return train, val.subset(slice(0, val_examples))
    if len(train) < 2:
        raise DataFormatError(f"{plural(len(train), 'training pair')} within sft.max_length: at least 2 are needed "
                              "(one held out for the validation loss), or give sft.val_file")
    held = held_out(len(train), val_examples)
    return train.subset(slice(0, len(train) - held)), train.subset(slice(len(train) - held, None))

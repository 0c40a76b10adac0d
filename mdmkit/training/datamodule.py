"""Data for puzzle tasks: an endless, step-indexed stream of training batches and a fixed validation subset."""

from __future__ import annotations

from typing import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from mdmkit.tasks.base import PuzzleTask, Split


class StepIndexedBatches(IterableDataset):
    """Batch number s is a pure function of (seed, s, rank): resuming at step s replays exactly what follows.

    Examples are drawn with replacement, so there are no epochs whose boundaries a resume would have to
    reconstruct; each rank draws its own stream, so DDP needs no distributed sampler.
    """

    def __init__(self, split: Split, batch_size: int, seed: int, start_step: int, rank: int, world_size: int) -> None:
        self.split, self.batch_size, self.seed = split, batch_size, seed
        self.start_step, self.rank, self.world_size = start_step, rank, world_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = self.start_step
        generator = torch.Generator()
        while True:
            generator.manual_seed((self.seed * 1_000_003 + step) * self.world_size + self.rank)
            index = torch.randint(len(self.split), (self.batch_size,), generator=generator)
            yield self.split.tokens[index], self.split.answer_mask[index]
            step += 1


class PuzzleDataModule(L.LightningDataModule):
    def __init__(self, task: PuzzleTask, batch_size: int, eval_batch_size: int, val_examples: int, seed: int) -> None:
        super().__init__()
        self.task = task
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_examples, self.seed = val_examples, seed
        self.splits: dict[str, Split] | None = None

    def prepare_data(self) -> None:
        self.task.load_splits()  # generates and caches once (rank 0), before the other ranks read the cache

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self.task.load_splits()

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        batches = StepIndexedBatches(self.splits["train"], self.batch_size, self.seed, start, rank, world)
        return DataLoader(batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        val = self.splits["val"].head(self.val_examples)
        return DataLoader(TensorDataset(val.tokens, val.answer_mask), batch_size=self.eval_batch_size)

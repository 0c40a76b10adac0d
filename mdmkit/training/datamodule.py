"""Data for puzzle tasks: an endless, step-indexed stream of training batches and a fixed validation subset."""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from mdmkit.core.seeding import stream_seed
from mdmkit.tasks.base import PuzzleTask, Split


class StepIndexedBatches(IterableDataset):
    """Batch number s is a pure function of (seed, s, rank): resuming at step s replays exactly what follows.

    Rows are drawn with replacement from `columns` (tensors sharing their first dimension), so there are no
    epochs whose boundaries a resume would have to reconstruct; each rank draws its own stream, so DDP needs
    no distributed sampler.
    """

    def __init__(self, columns: tuple[torch.Tensor, ...], batch_size: int, seed: int, start_step: int, rank: int,
                 world_size: int) -> None:
        self.columns, self.batch_size, self.seed = columns, batch_size, seed
        self.start_step, self.rank, self.world_size = start_step, rank, world_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        step = self.start_step
        generator = torch.Generator()
        while True:
            generator.manual_seed(stream_seed(self.seed, step, self.rank, self.world_size))
            index = torch.randint(len(self.columns[0]), (self.batch_size,), generator=generator)
            yield tuple(column[index] for column in self.columns)
            step += 1


def step_indexed_loader(trainer: L.Trainer | None, columns: tuple[torch.Tensor, ...], batch_size: int,
                        seed: int) -> DataLoader:
    """The training loader that continues at the trainer's step (0 without a trainer) on this rank."""
    start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
    rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
    return DataLoader(StepIndexedBatches(columns, batch_size, seed, start, rank, world), batch_size=None)


class PuzzleDataModule(L.LightningDataModule):
    def __init__(self, task: PuzzleTask, batch_size: int, eval_batch_size: int, val_examples: int, seed: int) -> None:
        super().__init__()
        self.task = task
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_examples, self.seed = val_examples, seed
        self.splits: dict[str, Split] | None = None

    def prepare_data(self) -> None:
        # generates and caches once (rank 0), before the other ranks read the cache in `setup`; kept, so this
        # process does not read the cache a second time
        self.splits = self.task.load_splits()

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self.task.load_splits()

    def train_dataloader(self) -> DataLoader:
        train = self.splits["train"]
        return step_indexed_loader(self.trainer, (train.tokens, train.answer_mask), self.batch_size, self.seed)

    def val_dataloader(self) -> DataLoader:
        val = self.splits["val"].head(self.val_examples)
        return DataLoader(TensorDataset(val.tokens, val.answer_mask), batch_size=self.eval_batch_size)

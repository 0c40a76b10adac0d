"""Data for puzzle tasks: an endless, step-indexed stream of training batches and a fixed validation subset."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from mdmkit.core.seeding import stream_seed
from mdmkit.tasks.base import PuzzleTask, Split

Transform = Callable[..., tuple[torch.Tensor, ...]]  # (*columns, generator) -> columns


class StepIndexedBatches(IterableDataset):
    """Batch number s is a pure function of (seed, s, rank): resuming at step s replays exactly what follows.

    Rows are drawn with replacement from `columns` (tensors sharing their first dimension), so there are no
    epochs whose boundaries a resume would have to reconstruct; each rank draws its own stream, so DDP needs
    no distributed sampler. `transform` (e.g. a task's random symmetries) draws from the same seeded generator,
    after the rows, so it replays on a resume as well.
    """

    def __init__(self, columns: tuple[torch.Tensor, ...], batch_size: int, seed: int, start_step: int, rank: int,
                 world_size: int, transform: Transform | None = None) -> None:
        self.columns, self.batch_size, self.seed = columns, batch_size, seed
        self.start_step, self.rank, self.world_size = start_step, rank, world_size
        self.transform = transform

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        step = self.start_step
        generator = torch.Generator()
        while True:
            generator.manual_seed(stream_seed(self.seed, step, self.rank, self.world_size))
            index = torch.randint(len(self.columns[0]), (self.batch_size,), generator=generator)
            batch = tuple(column[index] for column in self.columns)
            yield batch if self.transform is None else self.transform(*batch, generator)
            step += 1


def step_indexed_loader(trainer: L.Trainer | None, columns: tuple[torch.Tensor, ...], batch_size: int,
                        seed: int, transform: Transform | None = None) -> DataLoader:
    """The training loader that continues at the trainer's step (0 without a trainer) on this rank."""
    start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
    rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
    batches = StepIndexedBatches(columns, batch_size, seed, start, rank, world, transform)
    return DataLoader(batches, batch_size=None)


class PuzzleDataModule(L.LightningDataModule):
    """`augment`: each training example under a fresh random symmetry of its task (`PuzzleTask.augment`)."""

    def __init__(self, task: PuzzleTask, batch_size: int, eval_batch_size: int, val_examples: int, seed: int,
                 augment: bool = False) -> None:
        super().__init__()
        self.task, self.augment = task, augment
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
        transform = self.task.augment if self.augment else None
        return step_indexed_loader(self.trainer, (train.tokens, train.answer_mask), self.batch_size, self.seed,
                                   transform)

    def val_dataloader(self) -> DataLoader:
        val = self.splits["val"].head(self.val_examples)
        return DataLoader(TensorDataset(val.tokens, val.answer_mask), batch_size=self.eval_batch_size)

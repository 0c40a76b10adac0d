"""Data for puzzle tasks: an endless, step-indexed stream of training batches and a fixed validation subset."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

from mdmkit.core.seeding import stream_seed
from mdmkit.tasks.base import PuzzleTask, Split

WORKER_TIMEOUT_S = 300
Batch = tuple[torch.Tensor | int, ...]  # a batch's columns (a transform may add e.g. the seed of its noise)
Transform = Callable[..., Batch]  # (*columns, generator) -> batch


class StepIndexedBatches(IterableDataset):
    """Batch number s is a pure function of (seed, s, rank): resuming at step s replays exactly what follows.

    Each batch takes `batch_size` rows of `columns` (tensors sharing their first dimension), drawn with
    replacement, so there are no epochs whose boundaries a resume would have to reconstruct. Rank r of W draws
    batch number s * W + r of one stream, so DDP needs no distributed sampler, and W processes see at each step the
    batches one process sees under W-fold gradient accumulation. `transform` (e.g. a task's random symmetries)
    draws from the same seeded generator, after the rows, so it replays on a resume as well. Under k loader workers,
    worker w makes steps w, w + k, ...: the loader takes their batches in turn, so the stream is the same as in one
    process.
    """

    def __init__(self, columns: Sequence[torch.Tensor], batch_size: int, seed: int, start_step: int, rank: int,
                 world_size: int, transform: Transform | None = None) -> None:
        self.columns, self.batch_size, self.seed = tuple(columns), batch_size, seed
        self.start_step, self.rank, self.world_size = start_step, rank, world_size
        self.transform = transform

    def __iter__(self) -> Iterator[Batch]:
        worker = get_worker_info()
        first, stride = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        step = self.start_step + first
        generator = torch.Generator()
        while True:
            generator.manual_seed(stream_seed(self.seed, step * self.world_size + self.rank))
            index = torch.randint(len(self.columns[0]), (self.batch_size,), generator=generator)
            batch = tuple(column[index] for column in self.columns)
            yield batch if self.transform is None else self.transform(*batch, generator)
            step += stride


def step_indexed_loader(trainer: L.Trainer | None, columns: Sequence[torch.Tensor], batch_size: int, seed: int,
                        transform: Transform | None = None, workers: int = 0) -> DataLoader:
    """The training loader that continues at the trainer's step (0 without a trainer) on this rank, its batches made
    by `workers` processes (0: in the training process). Batches for a GPU come in pinned memory: copied from
    pageable memory, each batch would make the host wait for the GPU."""
    start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
    rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
    pinned = trainer is not None and trainer.strategy.root_device.type == "cuda"
    # a batch takes milliseconds: a worker silent for minutes is stuck, and training stops with an error, not a hang
    return DataLoader(StepIndexedBatches(columns, batch_size, seed, start, rank, world, transform), batch_size=None,
                      pin_memory=pinned, num_workers=workers, timeout=WORKER_TIMEOUT_S if workers else 0)


class PuzzleDataModule(L.LightningDataModule):
    """`augment`: each training example under a fresh random symmetry of its task (`PuzzleTask.augment`).
    `workers`: processes that make the training batches beside the training one, so a GPU's step need not wait
    for the host to make the next batch."""

    def __init__(self, task: PuzzleTask, batch_size: int, eval_batch_size: int, val_examples: int, seed: int,
                 augment: bool = False, workers: int = 0) -> None:
        super().__init__()
        self.task, self.augment, self.workers = task, augment, workers
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_examples, self.seed = val_examples, seed
        self.splits: dict[str, Split] | None = None

    def prepare_data(self) -> None:
        # generates and caches once (rank 0), before the other ranks read the cache in `setup`; kept, so this
        # process does not read the cache a second time
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self.task.load_splits()

    def train_dataloader(self) -> DataLoader:
        assert self.splits is not None, "after setup"
        train = self.splits["train"]
        return step_indexed_loader(self.trainer, (train.tokens, train.answer_mask), self.batch_size, self.seed,
                                   self.task.augment if self.augment else None, self.workers)

    def val_dataloader(self) -> DataLoader:
        assert self.splits is not None, "after setup"
        val = self.splits["val"].head(self.val_examples)
        return DataLoader(TensorDataset(val.tokens, val.answer_mask), batch_size=self.eval_batch_size)

"""Trajectory batches for indicator training: an endless step-indexed stream and a held-out validation set."""

from __future__ import annotations

from typing import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from mdmkit.config import require
from mdmkit.indicator.trajectories import (
    Trajectories,
    TrajectoryConfig,
    build_trajectories,
    load_trajectories,
)
from mdmkit.tasks.base import PuzzleTask

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # tokens [B, L], reveal_step [B, L], steps [B]


class TrajectoryBatches(IterableDataset):
    """Batch number s is a pure function of (seed, s, rank), so a resumed run replays exactly what follows
    (as `mdmkit.training.datamodule.StepIndexedBatches`, for trajectories)."""

    def __init__(
        self, data: Trajectories, batch_size: int, seed: int, start_step: int, rank: int, world: int
    ) -> None:
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.start_step, self.rank, self.world = start_step, rank, world

    def __iter__(self) -> Iterator[Batch]:
        step = self.start_step
        generator = torch.Generator()
        while True:
            generator.manual_seed((self.seed * 1_000_003 + step) * self.world + self.rank)
            rows = torch.randint(len(self.data), (self.batch_size,), generator=generator)
            yield self.data.tokens[rows], self.data.reveal_step[rows], self.data.steps[rows]
            step += 1


class TrajectoryDataModule(L.LightningDataModule):
    """Records the trajectories if missing (resumable), then trains on all but the last `val_examples`."""

    def __init__(self, config: TrajectoryConfig, task: PuzzleTask, batch_size: int, eval_batch_size: int,
                 val_examples: int, seed: int) -> None:
        super().__init__()
        self.config, self.task = config, task
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_examples, self.seed = val_examples, seed
        self.train_data: Trajectories | None = None
        self.val_data: Trajectories | None = None

    def prepare_data(self) -> None:
        build_trajectories(self.config, self.task)

    def setup(self, stage: str | None = None) -> None:
        if self.train_data is not None:
            return
        data = load_trajectories(self.config.directory(self.task), self.config.n_examples)
        require(len(data) > self.val_examples,
                f"data.val_examples={self.val_examples} leaves no training trajectories of {len(data)}")
        self.train_data = data.take(slice(None, len(data) - self.val_examples))
        self.val_data = data.take(slice(len(data) - self.val_examples, None))

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        rank, world = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        return DataLoader(TrajectoryBatches(self.train_data, self.batch_size, self.seed, start, rank, world),
                          batch_size=None)

    def val_dataloader(self) -> DataLoader:
        val = self.val_data
        dataset = TensorDataset(val.tokens, val.reveal_step, val.steps)
        return DataLoader(dataset, batch_size=self.eval_batch_size)

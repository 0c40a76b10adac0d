"""Trajectory batches for indicator training: an endless step-indexed stream and a held-out validation set."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from mdmkit.core.config import require
from mdmkit.tasks.base import PuzzleTask
from mdmkit.training.datamodule import step_indexed_loader
from mdmkit.training.indicator.trajectories import (
    Trajectories,
    TrajectoryConfig,
    build_trajectories,
    load_trajectories,
)

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # tokens [B, L], reveal_step [B, L], steps [B]


class TrajectoryDataModule(L.LightningDataModule):
    """Records the trajectories if missing (resumable), then trains on all but the last `val_examples`."""

    def __init__(self, config: TrajectoryConfig, task: PuzzleTask, batch_size: int, eval_batch_size: int,
                 val_examples: int, seed: int, workers: int = 0) -> None:
        super().__init__()
        self.config, self.task, self.workers = config, task, workers
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_examples, self.seed = val_examples, seed
        require(config.n_examples > val_examples,  # checked before any trajectory is recorded
                f"data.val_examples={val_examples} leaves no training trajectories of "
                f"trajectories.n_examples={config.n_examples}")
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
        data = self.train_data
        assert data is not None, "after setup"
        return step_indexed_loader(self.trainer, (data.tokens, data.reveal_step, data.steps), self.batch_size,
                                   self.seed, workers=self.workers)

    def val_dataloader(self) -> DataLoader:
        val = self.val_data
        assert val is not None, "after setup"
        return DataLoader(TensorDataset(val.tokens, val.reveal_step, val.steps), batch_size=self.eval_batch_size)

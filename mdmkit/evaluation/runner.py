"""Sample a split with a sampler and score it, counting every forward pass per sample."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from mdmkit.samplers import ForwardCounter, MaskedSampler
from mdmkit.tasks.base import PuzzleTask, Split


@dataclass
class EvalResult:
    correct: np.ndarray  # bool [N]
    nfe: np.ndarray  # int [N], forward passes each sample took part in
    wall_time_s: float
    predictions: torch.Tensor = field(repr=False)

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    def summary(self) -> dict[str, Any]:
        nfe = self.nfe.astype(float)
        counts = np.bincount(self.nfe)
        return {
            "n": int(len(self.correct)),
            "accuracy": self.accuracy,
            "nfe_mean": float(nfe.mean()),
            "nfe": {
                "std": float(nfe.std()),
                "min": int(self.nfe.min()),
                "p50": float(np.percentile(nfe, 50)),
                "p90": float(np.percentile(nfe, 90)),
                "max": int(self.nfe.max()),
                "histogram": {int(v): int(c) for v, c in enumerate(counts) if c},
            },
            "wall_time_s": self.wall_time_s,
        }


@torch.no_grad()
def sample_split(
    network: nn.Module,
    task: PuzzleTask,
    split: Split,
    sampler: MaskedSampler,
    batch_size: int = 256,
    seed: int = 0,
    progress: bool = False,
) -> EvalResult:
    """Mask every answer position, let `sampler` fill them, and score the completions."""
    device = next(network.parameters()).device
    was_training = network.training
    network.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    correct, nfe, predictions = [], [], []
    start = time.perf_counter()
    for begin in tqdm(range(0, len(split), batch_size), desc="sampling", disable=not progress, leave=False):
        target = split.tokens[begin : begin + batch_size].to(device)
        answer_mask = split.answer_mask[begin : begin + batch_size].to(device)
        counter = ForwardCounter(network, target.shape[0])
        prompt = target.masked_fill(answer_mask, task.mask_id)
        predicted = sampler.sample(counter, prompt, task.mask_id, generator).tokens
        correct.append(task.score(predicted, target, answer_mask).cpu())
        nfe.append(counter.nfe)
        predictions.append(predicted.cpu())
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    network.train(was_training)
    return EvalResult(torch.cat(correct).numpy(), torch.cat(nfe).numpy(), wall, torch.cat(predictions))

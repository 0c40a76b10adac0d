"""Honest cost accounting: NFE is counted from real forward passes, per sample."""

from __future__ import annotations

from typing import Callable

import torch


class ForwardCounter:
    """Wraps a network so each forward pass is charged to exactly the batch rows it ran on.

    The evaluation harness owns the counter and hands it to the sampler, so a sampler cannot
    under-report: a row that has finished and is no longer passed in stops counting.
    """

    def __init__(self, network: Callable[[torch.Tensor], torch.Tensor], batch_size: int) -> None:
        self.network = network
        self.nfe = torch.zeros(batch_size, dtype=torch.long)
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Run the network on `tokens` [len(rows), L], the current state of batch rows `rows`."""
        if tokens.shape[0] != rows.numel():
            raise ValueError(f"{tokens.shape[0]} sequences passed for {rows.numel()} rows")
        self.nfe[rows.cpu()] += 1
        self.calls += 1
        return self.network(tokens)

"""Honest cost accounting: NFE is counted from real forward passes, per sample.

A full forward of the main network costs 1 for every row it ran on. Cheaper passes (a planner, an indicator
MLP, a partial stack of layers) are charged at their share of a full forward, kept per kind so they can be
reported both inside the total cost and on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class ForwardCounter:
    """Wraps a network so each forward pass is charged to exactly the batch rows it ran on.

    The evaluation harness owns the counter and hands it to the sampler, so a sampler cannot
    under-report: a row that has finished and is no longer passed in stops counting.
    """

    def __init__(self, network: Callable[..., torch.Tensor], batch_size: int) -> None:
        self.network = network
        self.nfe = torch.zeros(batch_size, dtype=torch.long)
        self.extra: dict[str, torch.Tensor] = {}  # kind -> per-row fractional cost
        self.nfe_at_stop = torch.full((batch_size,), -1, dtype=torch.long)  # generate_until point, -1: never
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Run the network on `tokens` [len(rows), L], the current state of batch rows `rows`."""
        if tokens.shape[0] != rows.numel():
            raise ValueError(f"{tokens.shape[0]} sequences passed for {rows.numel()} rows")
        self.nfe[rows.cpu()] += 1
        self.calls += 1
        return self.network(tokens, **kwargs)

    def charge(self, rows: torch.Tensor, share: float, kind: str) -> None:
        """Record a pass of something other than the main network at `share` of a full forward."""
        if share < 0:
            raise ValueError(f"a pass cannot cost {share} forwards")
        cost = self.extra.setdefault(kind, torch.zeros(self.nfe.shape[0], dtype=torch.float64))
        cost[rows.cpu()] += share

    def mark_stopped(self, rows: torch.Tensor) -> None:
        """Note the NFE at which `rows` met their stop condition (the first time only)."""
        rows = rows.cpu()
        first = self.nfe_at_stop[rows] < 0
        self.nfe_at_stop[rows[first]] = self.nfe[rows[first]]

    @property
    def cost(self) -> torch.Tensor:
        """Per-row total cost in full-forward units: NFE plus every fractional pass."""
        total = self.nfe.to(torch.float64)
        for cost in self.extra.values():
            total = total + cost
        return total

"""Exponential moving average of a network's weights, kept in the checkpoint and used for evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class EMA(nn.Module):
    """Shadow copy of the parameters, updated after every optimizer step.

    Being a module, the shadow weights travel with the LightningModule's state dict (and so the
    checkpoint); `swapped_in` temporarily loads them into the live network for validation/evaluation.
    """

    def __init__(self, network: nn.Module, decay: float) -> None:
        super().__init__()
        self.decay = decay
        self.shadow = nn.ParameterDict(
            {self._key(n): nn.Parameter(p.detach().clone(), requires_grad=False) for n, p in network.named_parameters()}
        )

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "__")

    @torch.no_grad()
    def update(self, network: nn.Module, step: int) -> None:
        # warm-up: average over the steps so far while step is small, so early EMA is not stuck at init
        decay = min(self.decay, (1 + step) / (10 + step))
        named = list(network.named_parameters())
        shadows = [self.shadow[self._key(name)] for name, _ in named]
        # one fused call rather than a kernel launch per tensor: a small model's GPU step is many small kernels
        torch._foreach_lerp_(shadows, [param.detach() for _, param in named], 1.0 - decay)

    @contextmanager
    def swapped_in(self, network: nn.Module) -> Iterator[None]:
        live = {name: param.detach().clone() for name, param in network.named_parameters()}
        with torch.no_grad():
            for name, param in network.named_parameters():
                param.copy_(self.shadow[self._key(name)])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in network.named_parameters():
                    param.copy_(live[name])

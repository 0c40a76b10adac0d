"""The optimizer settings of a training run (no Lightning here: the CLI validates them before importing it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.core.config import Validated, require


@dataclass
class OptimConfig(Validated):
    """AdamW with linear warm-up then cosine decay to `min_lr_ratio * lr` at the last step."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 500
    min_lr_ratio: float = 0.1

    def validate(self) -> None:
        require(self.lr > 0, f"lr={self.lr} must be > 0")
        require(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
        require(all(0 <= b < 1 for b in self.betas), f"betas={self.betas} must lie in [0, 1)")
        require(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")

    def adamw(self, network: torch.nn.Module) -> torch.optim.AdamW:
        """AdamW over the trainable parameters; weight decay on matrices only (not biases, norms)."""
        params = [p for p in network.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=self.lr, betas=self.betas)

    def configure(self, network: torch.nn.Module, max_steps: int) -> dict[str, Any]:
        """AdamW and its per-step schedule over `max_steps` (a 100k-step one if <= 0), as a LightningModule's
        `configure_optimizers` returns them."""
        optimizer = self.adamw(network)
        total = max_steps if max_steps > 0 else 100_000
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.lr_factor(step, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def lr_factor(self, step: int, total_steps: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

"""Device names from configs (`device=auto|cpu|cuda|cuda:1`) to torch devices."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

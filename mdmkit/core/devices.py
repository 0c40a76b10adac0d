"""Device names from configs (`device=auto|cpu|cuda|cuda:1|mps`) to torch devices."""

from __future__ import annotations

import torch

from mdmkit.core.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when there is one, else the CPU. A device this machine lacks is a ConfigError (one line), not
    torch's traceback from deep inside the first `.to(device)`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={name} is not a device: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ConfigError(f"device={name}, but {why}: use device=auto (CUDA when there is one) or device=cpu")
        # torch's stub types `index` int; "cuda" without one gives None
        if device.index is not None and device.index >= torch.cuda.device_count():  # type: ignore[redundant-expr]
            raise ConfigError(f"device={name}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={name}, but MPS is not available: use device=auto or device=cpu")
    return device

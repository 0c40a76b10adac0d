"""The Lightning Trainer's device settings checked against this machine before anything heavy loads.

`trainer: gpu` on a machine without one is one line naming the fix, not Lightning's error once the model and data
have loaded; `precision: auto` (conf/trainer/auto.yaml) becomes the device's own: bf16-mixed on a GPU that has
it, 16-mixed on one that does not, 32-true on a CPU. The resolved node is what the run records.
"""

from __future__ import annotations

from typing import Any

import torch

from mdmkit.core.errors import ConfigError

_GPU = ("gpu", "cuda")
_FIX = "trainer=auto runs on the device present (a GPU when there is one), trainer=cpu on the CPU"


def _no_cuda() -> str:
    return "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"


def resolve_trainer(node: dict[str, Any]) -> dict[str, Any]:
    """`node` (conf/trainer/) checked against the devices present, with `precision: auto` resolved."""
    accelerator = str(node.get("accelerator", "auto")).lower()
    cuda = torch.cuda.is_available()
    if accelerator in _GPU and not cuda:
        raise ConfigError(f"trainer: accelerator={accelerator}, but {_no_cuda()}: {_FIX}")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"trainer: accelerator=mps, but MPS is not available: {_FIX}")
    on_gpu = accelerator in _GPU or (accelerator == "auto" and cuda)
    devices = node.get("devices")
    if on_gpu and isinstance(devices, int) and not isinstance(devices, bool) and devices > torch.cuda.device_count():
        raise ConfigError(f"trainer: devices={devices}, but this machine has {torch.cuda.device_count()} GPU(s): "
                          f"trainer.devices={torch.cuda.device_count()} (-1: every GPU)")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not cuda and not torch.backends.mps.is_available())
    precision = node.get("precision")
    if precision == "auto":
        precision = "32-true" if not on_gpu else "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    elif on_cpu and str(precision) in ("16", "16-mixed"):
        raise ConfigError(f"trainer: precision={precision} needs a GPU (a CPU has no float16 autocast): "
                          "trainer.precision=bf16-mixed or 32-true")
    return {**node, "precision": precision} if "precision" in node else node

"""Fully sharded data parallel (trainer=fsdp) over mdmkit's networks: one shard unit per transformer block, so a
GPU holds one block's whole weights at a time."""

from __future__ import annotations

from torch import nn

from mdmkit.models import transformer
from mdmkit.models.llm import diffusion_lm


def block_classes() -> set[type[nn.Module]]:
    """The blocks FSDP wraps one by one (Lightning's `auto_wrap_policy`)."""
    return {diffusion_lm.Block, transformer.Block}

"""LLaDA2.1's decoder (`sampler=llada2_1`): block diffusion with mask-to-token reveals and token-to-token edits.

The model's own `generate` (hub modeling_llada2_moe.py of inclusionAI/LLaDA2.1-mini) on LLaDA2.0's network: blocks
from position 0 (the prompt's whole blocks skipped), each forward recomputing the prefix up to the block's end (no
cache, so NFE is its count of forward calls). Inside a block each step reveals every masked position whose greedy
token scores above `tau` (strictly; the softmax over every token, the mask included), or the `num_to_transfer` most
confident when fewer do (`M2TSampler`), and rewrites every decided position whose token the model now replaces with
probability above the editing threshold; once the block is full, post steps edit until nothing changes
(`EditingSampler`, rules/editing.py). The attention is the option `attention` (core/window_walk.py): the block-causal
pattern the network was trained with (default) or the reference's 0/1 mask added to the scores. docs/samplers.md
("LLaDA2.1") says why the default is block-causal and how far the two part on the reference's fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.block_walk import require_block_causal
from mdmkit.samplers.core.budget import Ranked, prefix_length
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.core.window_walk import WindowAttention, walk_windows
from mdmkit.samplers.rules.editing import EditingSampler, revealed_by


@dataclass(frozen=True)
class TransferThreshold:
    """LLaDA2.1's M2T count: every ranked position with confidence > tau when at least `num_to_transfer` are, else
    the `num_to_transfer` best (a prefix under confidence order)."""

    tau: float
    num_to_transfer: int

    def __post_init__(self) -> None:
        require(0.0 <= self.tau <= 1.0, f"tau={self.tau} must lie in [0, 1]")
        require(self.num_to_transfer >= 1, f"num_to_transfer={self.num_to_transfer} must be >= 1")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        above = prefix_length((ranked.confidence > self.tau) & ranked.valid)
        return torch.maximum(above, ranked.n_eligible.clamp(max=self.num_to_transfer))


@dataclass
class M2TSampler(MaskedSampler):
    """LLaDA2.1's mask-to-token rule: every position scored above tau, at least `num_to_transfer` (scores from the
    softmax with the mask token, as its code reads them)."""

    budget_rule = TransferThreshold
    tau: float = 0.7
    num_to_transfer: int = 1
    mask_in_softmax: bool = True


def _quality_mode() -> EditingSampler:
    """The model card's "Quality Mode": threshold 0.7, editing threshold 0.5, its default 16 post steps."""
    return EditingSampler(base=M2TSampler(), threshold=0.5, post_steps=16)


@dataclass
class Llada21Sampler(Sampler):
    """LLaDA2.1's generate (see the module): `rule` fills each block of `block_size`, each forward recomputing the
    window from position 0 under `attention`."""

    block_size: int = 32
    attention: WindowAttention = "block_causal"  # block_causal (as trained) | reference (its generate's 0/1 mask)
    rule: EditingSampler | MaskedSampler = field(default_factory=_quality_mode)

    def validate(self) -> None:
        require(self.block_size >= 1, f"block_size={self.block_size} must be >= 1")
        base = revealed_by(self.rule)
        require(base.block_length is None and base.cache == "none",
                "the rule fills one block of a window recomputed each step: its block_length must be null and its "
                "cache none")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        require_block_causal(network, "LLaDA2.1's decoder", instead="editing")
        return walk_windows(self, network, canvas)

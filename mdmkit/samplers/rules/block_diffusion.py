"""Block diffusion decoding (Fast-dLLM v2; LLaDA2.0's generate): finished blocks in an exact KV cache, sub-blocks
filled by any rule. The walk itself is core/block_walk.py; this is the sampler: its settings and the refusal of a
network that does not attend block-causally. docs/samplers.md ("Block diffusion") explains `block_cache` (an
approximation), `prompt_block_unseen` and `attention_block`.

`attention_block`: Fast-dLLM v2's generate commits a block (and prefills the prompt) with a forward told its
`block_size`, but runs the steps that fill a block without it, so its forward's default of 32 shapes their mask: with
blocks of 64 the first 32 positions of a block do not see the last 32. The `fast_dllm_v2` preset sets 32 to reproduce
that; null (the default) lets every position see its whole block, the same thing for blocks that divide 32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from mdmkit.core.config import require
from mdmkit.models.denoiser import KV_CACHE
from mdmkit.samplers.core.block_walk import require_block_causal, walk_blocks
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.editing import EditingSampler, revealed_by
from mdmkit.samplers.rules.llada2 import Llada2Sampler
from mdmkit.samplers.rules.sdar import SdarSampler
from mdmkit.samplers.rules.threshold import ThresholdSampler


@dataclass
class BlockDiffusionSampler(Sampler):
    """Block diffusion decoding (see the module). `rule` (any masked sampler without blocks of its own, with token
    editing or without, LLaDA2.0's or SDAR's rule) fills each sub-block; its temperature and top_p also choose the
    token each committing forward predicts."""

    block_size: int = 32
    sub_block: int = 8
    rule: MaskedSampler | Llada2Sampler | SdarSampler | EditingSampler = field(
        default_factory=lambda: ThresholdSampler(tau=0.9, mask_in_softmax=True))
    block_cache: bool = False  # Fast-dLLM v2's sub-block cache (an approximation, see the module)
    prompt_block_unseen: bool = False  # as the reference generate: a prompt exactly one block long is not seen
    commit_reveals: bool = True  # the committing forward reveals the next block's first token (False: the rule does)
    # the forwards that fill a block attend block-causally in groups of this many positions (from position 0) inside
    # it, instead of over the whole block: 32 is Fast-dLLM v2's generate at any block_size (see the module)
    attention_block: int | None = None
    # a block is committed (its keys and values stored) as soon as it is full, the last one too, before the stop
    # condition is read: one forward more per answer than the next block's start needs (SDAR's generate)
    store_finished: bool = False

    requires: ClassVar[frozenset[str]] = frozenset({KV_CACHE})

    def validate(self) -> None:
        require(self.block_size >= 1, f"block_size={self.block_size} must be >= 1")
        require(1 <= self.sub_block <= self.block_size and self.block_size % self.sub_block == 0,
                f"sub_block={self.sub_block} must divide block_size={self.block_size}")
        require(self.attention_block is None or self.attention_block >= 1,
                f"attention_block={self.attention_block} must be >= 1 or null")
        require(not (self.store_finished and self.commit_reveals),
                "store_finished commits a block before the next one exists: it needs commit_reveals=false")
        # (a rule without blocks has no cache of its own either: the masked loop's caches need block_length)
        inner = revealed_by(self.rule)
        require(not isinstance(inner, MaskedSampler) or inner.block_length is None,
                "rule.block_length must be null: the rule fills one sub-block")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        require_block_causal(network, "block diffusion", instead="eb")
        return walk_blocks(self, network, canvas)

"""WINO (wide-in, narrow-out): draft loosely, verify strictly, re-mask what fails verification.

Hong et al. 2025, arXiv 2507.18578; code: Feng-Hong/WINO-DLLM (`decoding_wino`), whose details are followed
(docs/samplers.md, "WINO and dilated unmasking"). Block by block, one forward a step drafts the masked positions
above `tau_in` and re-masks earlier-revealed positions of the block whose probability under a shadow block (one mask
per block position after the canvas, which the canvas never attends to) is below `tau_out`. A step re-masks at most
the previous step's draft count minus one, so a block of n positions takes at most n steps. With a stop condition
only finished blocks are settled (a revealed stop token can still be re-masked). Rows are independent; ties go low.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mdmkit.core.config import require
from mdmkit.core.errors import CapabilityError
from mdmkit.models.denoiser import CAPABILITIES, KV_CACHE, positions_from, without_mask
from mdmkit.samplers.core.blocks import best_of, check_sampling_fields
from mdmkit.samplers.core.choice import choose_tokens, predictive_distribution
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.driver import Batch, Step
from mdmkit.samplers.core.kv_cache import CacheMode
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler


@dataclass
class _Shadow:
    """One step's extended forward, read at the current block's positions (slot j: the row's j-th one)."""

    at: torch.Tensor  # [R, S] the slots' positions on the canvas (padding slots: clamped, see `valid`)
    valid: torch.Tensor  # [R, S] slots that are positions of the row's block
    canvas: torch.Tensor  # [R, S, V] the canvas's logits at those positions
    verify: torch.Tensor  # [R, S, V] the shadow's logits for them


def _onto(canvas: torch.Tensor, shadow: _Shadow, values: torch.Tensor) -> torch.Tensor:
    """`canvas` [R, L] with the slots' `values` [R, S] written at their positions (padding slots dropped)."""
    length = canvas.shape[1]
    target = torch.where(shadow.valid, shadow.at, length)  # padding slots go to a spare column, cut off below
    spare = torch.cat([canvas, canvas[:, :1]], 1)
    return spare.scatter(1, target, values.to(canvas.dtype))[:, :length]


@dataclass
class WinoSampler(Sampler):
    """WINO: threshold drafting, shadow-block verification and re-masking inside each block (see the module)."""

    requires: ClassVar[frozenset[str]] = frozenset({KV_CACHE})  # explicit positions and a full attention mask

    tau_in: float = 0.6  # wide-in: draft masked positions whose confidence is > tau_in
    tau_out: float = 0.9  # narrow-out: re-mask revealed positions whose verified probability is < tau_out
    draft_share: float = 0.7  # the draft cap is clamp(floor(draft_share * masked), draft_floor, draft_cap)
    draft_floor: int = 5
    draft_cap: int | None = 20  # None: no upper bound
    temperature: float = 0.0  # 0: argmax; > 0: sample from softmax(logits / T)
    top_p: float = 1.0
    block_length: int | None = None  # semi-autoregressive blocks over the answer positions (None: one block)
    stop_early: bool = True  # with a stop condition: finished rows stop computing (else only the point is noted)
    cache: CacheMode = "none"  # only none: the shadow block is recomputed with the whole canvas every step

    def validate(self) -> None:
        require(0.0 <= self.tau_in <= 1.0, f"tau_in={self.tau_in} must lie in [0, 1]")
        require(0.0 <= self.tau_out <= 1.0, f"tau_out={self.tau_out} must lie in [0, 1]")
        require(0.0 < self.draft_share <= 1.0, f"draft_share={self.draft_share} must lie in (0, 1]")
        require(self.draft_floor >= 1, f"draft_floor={self.draft_floor} must be >= 1")
        require(self.draft_cap is None or self.draft_cap >= 1, f"draft_cap={self.draft_cap} must be >= 1 or null")
        require(self.draft_cap is None or self.draft_cap >= self.draft_floor,
                f"draft_cap={self.draft_cap} is below draft_floor={self.draft_floor}, which it would silently override")
        check_sampling_fields(self.temperature, self.top_p, self.block_length)
        require(self.cache == "none", f"cache={self.cache} is not supported by WINO (its verification reruns the "
                                      f"whole canvas with a shadow block every step): use cache=none")

    def draft_limit(self, masked: torch.Tensor) -> torch.Tensor:
        """The most positions a step may draft, per row, from the block's masked count `masked` [R] (the product in
        float32, as the code's `int(count * 0.7)` on a tensor)."""
        limit = (masked.float() * self.draft_share).long().clamp(min=self.draft_floor)
        return limit if self.draft_cap is None else limit.clamp(max=self.draft_cap)

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill `canvas` (see `Sampler.sample`) block by block; one forward per step and row."""
        missing = sorted(self.requires - network.capabilities)
        if missing:
            raise CapabilityError(f"sampler {type(self).__name__} needs {', '.join(missing)} "
                                  f"({CAPABILITIES[missing[0]]}: explicit positions and a full attention mask for "
                                  f"its shadow block), which the network does not provide")
        mask_id, generator, keep = canvas.mask_id, canvas.generator, canvas.attention_mask
        batch = Batch(network, canvas, stop_early=self.stop_early, block_length=self.block_length)
        positions = (torch.arange(batch.length, device=batch.x.device).expand(batch.x.shape[0], -1) if keep is None
                     else positions_from(keep.bool()))
        last_drafted = torch.zeros_like(batch.steps)  # the previous step's draft count in the row's block
        for step in batch:
            rows, state, in_block = step.rows, step.state, step.in_block
            if bool((step.in_block_steps >= in_block.sum(1)).any()):
                raise RuntimeError("internal: a WINO block took more steps than it has positions")
            shadow = self._forward(network, rows, state, in_block, positions[rows],
                                   None if keep is None else keep[rows].bool(), mask_id)
            held_token = state.gather(1, shadow.at)
            drafts_from = shadow.valid & (held_token == mask_id)
            verified = shadow.valid & (held_token != mask_id)  # revealed by an earlier step of this block
            drafted = without_mask(shadow.canvas, mask_id, torch.float64)
            probs = predictive_distribution(drafted, self.temperature, self.top_p)
            choice, confidence = choose_tokens(probs, self.temperature, generator)

            # wide-in: above tau_in, at most the cap (best first), at least the best one
            above = drafts_from & (confidence > self.tau_in)
            limit = self.draft_limit(drafts_from.sum(1))
            n_above = above.sum(1)
            capped = (n_above > limit) | (n_above == 0)
            count = torch.where(n_above > limit, limit, 1)
            draft = torch.where(capped[:, None], best_of(confidence, drafts_from, count, descending=True), above)
            drafted = draft.sum(1)

            # narrow-out: the shadow's probability of each earlier-revealed token of the block
            verify_probs = predictive_distribution(without_mask(shadow.verify, mask_id, torch.float64),
                                                   self.temperature, self.top_p)
            held = verify_probs.gather(-1, held_token[..., None]).squeeze(-1)
            fails = verified & (held < self.tau_out)
            bounded = fails.sum(1) >= last_drafted[rows]
            lowest = best_of(held, verified, (last_drafted[rows] - 1).clamp(min=0), descending=False)
            remask = torch.where(bounded[:, None], lowest, fails) & (drafted > 1)[:, None]

            slot_tokens = torch.where(remask, mask_id, torch.where(draft, choice, held_token))
            state = _onto(state, shadow, slot_tokens)
            batch.write(step, state, _onto(torch.zeros_like(state, dtype=torch.bool), shadow, draft))
            last_drafted[rows] = drafted
            batch.end(step, None if canvas.stop is None else self._settled(batch, step))
        return batch.result()

    @staticmethod
    def _settled(batch: Batch, step: Step) -> torch.Tensor:
        """The canvas with the open blocks of the step's rows masked: only finished blocks are settled (a revealed
        stop token can still be re-masked)."""
        view, state, mask_id = batch.x.clone(), batch.x[step.rows], batch.canvas.mask_id
        open_block = step.in_block & (state == mask_id).logical_and(step.in_block).any(1, keepdim=True)
        view[step.rows] = torch.where(open_block, mask_id, state)
        return view

    def _forward(self, network: ForwardCounter, rows: torch.Tensor, state: torch.Tensor, in_block: torch.Tensor,
                 positions: torch.Tensor, keep: torch.Tensor | None, mask_id: int) -> _Shadow:
        """One forward of the canvas followed by its shadow block (slot j: the row's j-th block position)."""
        count, length = state.shape
        device = state.device
        columns = torch.arange(length, device=device)
        per_row = in_block.sum(1)
        width = int(per_row.max())
        slot_at = torch.where(in_block, columns, length).sort(1).values[:, :width]  # block positions, in order
        valid = slot_at < length  # slots past a row's block are padding: they see themselves, none sees them
        slot_at = slot_at.clamp(max=length - 1)
        sees = torch.ones(count, length, dtype=torch.bool, device=device) if keep is None else keep

        canvas_rows = torch.cat([sees[:, None, :].expand(-1, length, -1),
                                 torch.zeros(count, length, width, dtype=torch.bool, device=device)], 2)
        shadow_canvas = sees[:, None, :] & (columns[None, None, :] != slot_at[:, :, None]) & valid[:, :, None]
        eye = torch.eye(width, dtype=torch.bool, device=device)[None]
        shadow_shadow = (valid[:, None, :] & valid[:, :, None]) | (eye & ~valid[:, :, None])
        attn_mask = torch.cat([canvas_rows, torch.cat([shadow_canvas, shadow_shadow], 2)], 1)[:, None]

        extended = torch.cat([state, torch.full((count, width), mask_id, dtype=state.dtype, device=device)], 1)
        where = torch.cat([positions, positions.gather(1, slot_at)], 1)
        logits = network(extended, rows, attn_mask=attn_mask, positions=where)
        canvas = logits[:, :length].gather(1, slot_at[:, :, None].expand(-1, -1, logits.shape[-1]))
        return _Shadow(slot_at, valid, canvas, logits[:, length:])

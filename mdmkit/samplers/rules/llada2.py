"""LLaDA2.0's rule inside a block: draw every position, reveal what clears the threshold, at least a schedule's count.

The rule of the model's own `generate` (hub modeling_llada2_moe.py), run by block diffusion (`sampler=llada2`). A step
draws every position of the block with one `torch.multinomial` from the canvas generator over the whole softmax, as
the reference does, so seeded runs agree; the hub's `temperature=0` still draws, which is `temperature: 1.0` here
(mdmkit's 0 takes the argmax). As there, the mask token can be drawn: a position revealed with it stays masked (and
is drawn again), and one still masked when the block's steps run out is left masked. `mask_never_drawn` keeps the
mask token out of the draw instead. docs/samplers.md ("LLaDA2.0") has the rule step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.blocks import check_sampling_fields
from mdmkit.samplers.core.counting import CountedNetwork
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler


def filtered_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits / T (T > 0, T != 1), then -inf outside the top-k tokens (ties kept), then outside the smallest
    prefix of the sorted distribution whose mass exceeds top_p (the reference's filters, in its order)."""
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        beyond = ordered.softmax(-1).cumsum(-1) > top_p
        beyond = torch.cat([torch.zeros_like(beyond[..., :1]), beyond[..., :-1]], -1)  # keep the crossing token
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), float("-inf"))
    return logits


def scheduled_counts(width: int, steps: int) -> torch.Tensor:
    """Tokens per step to spread `width` positions over `steps` steps: width // steps, one more for the first
    width % steps."""
    counts = torch.full((steps,), width // steps, dtype=torch.long)
    counts[: width % steps] += 1
    return counts


@dataclass
class Llada2Sampler(Sampler):
    """LLaDA2.0's in-block rule (see the module). Its fields are its own: the walk around it (block diffusion) has
    the blocks and the cache, and its ranking is always by confidence."""

    steps: int = 32  # at most this many steps per block
    tau: float = 0.95  # reveal every masked position scored above tau when they reach the step's count
    top_k: int = 0  # draw among the k most probable tokens (0: all)
    temperature: float = 0.0  # 0: argmax; > 0: draw from softmax(logits / T) (the reference's 0 draws: 1.0 here)
    top_p: float = 1.0
    stop_early: bool = True  # with a stop condition: finished rows stop computing (else only the point is noted)
    mask_never_drawn: bool = False  # True: the draw leaves the mask token out, so every revealed position is filled

    def validate(self) -> None:
        require(self.steps >= 1, f"steps={self.steps} must be >= 1")
        require(0.0 <= self.tau <= 1.0, f"tau={self.tau} must lie in [0, 1]")
        require(self.top_k >= 0, f"top_k={self.top_k} must be >= 0")
        check_sampling_fields(self.temperature, self.top_p, None)

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled:
        mask_id = canvas.mask_id
        batch = Batch(network, canvas, stop_early=self.stop_early, max_steps=self.steps)
        counts = scheduled_counts(batch.length, self.steps).to(batch.x.device)
        for step in batch:
            # left padding hidden (alone; inside block diffusion the blocks handle it); the scores read every token
            raw = batch.logits(step, None).float()
            probs = filtered_logits(raw, self.temperature, self.top_k, self.top_p).softmax(-1)
            tokens = self._draw(probs, raw, mask_id, canvas.generator)
            score = probs.gather(-1, tokens[..., None]).squeeze(-1).masked_fill(~step.masked, float("-inf"))
            above = score > self.tau
            # rows short of their count reveal that many most confident (at most every masked position)
            count = torch.minimum(counts[batch.steps[step.rows]], step.masked.sum(1))
            best = torch.topk(score, int(count.max()), dim=1).indices
            ranked = torch.zeros_like(above).scatter_(1, best, torch.arange(best.shape[1], device=best.device)[None]
                                                      < count[:, None])
            chosen = torch.where((above.sum(1) >= count)[:, None], above, ranked)
            # a chosen position that drew the mask token is written with it, as the reference does: it stays masked
            batch.reveal(step, chosen & (tokens != mask_id), tokens)
            batch.end(step)
        return batch.result()

    def _draw(self, probs: torch.Tensor, raw: torch.Tensor, mask_id: int,
              generator: torch.Generator | None) -> torch.Tensor:
        """A token per position [R, W] from `probs` [R, W, V]: one multinomial over every position (the reference's
        single call, so its random numbers), or the most probable at temperature 0; with `mask_never_drawn` the
        mask token's weight is zeroed first (`raw`, the unfiltered logits, pick the best other token where the
        filters left only the mask token)."""
        weights = probs
        if self.mask_never_drawn:
            weights = probs.clone()
            weights[..., mask_id] = 0.0
            empty = weights.sum(-1) == 0
            if bool(empty.any()):
                fallback = raw.index_fill(-1, torch.tensor([mask_id], device=raw.device), float("-inf"))
                weights[empty] = torch.nn.functional.one_hot(fallback[empty].argmax(-1),
                                                             probs.shape[-1]).to(probs.dtype)
        if self.temperature == 0.0:
            return weights.argmax(-1)
        flat = torch.multinomial(weights.view(-1, weights.shape[-1]), 1, generator=generator)
        return flat.view(weights.shape[:-1])

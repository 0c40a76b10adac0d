"""SDAR's rule inside a block: draw every position, reveal by its remasking strategy, a schedule's count per step.

The rule of `block_diffusion_generate` (JetAstra/SDAR's generate.py; TraDo decodes with the same), run by block
diffusion (`sampler=sdar`), which stores each block as soon as it is full, as that code does. A step draws every
position of the block with one `torch.multinomial` from the canvas generator (the reference's one call per step on
the global generator, so seeded runs agree) and scores each drawn token by its probability. Given each row's own
generator (`api.fill` with a seed per row), each row makes that call alone on its own: a batched row draws exactly
what its run alone draws, where rows sharing one generator would split its stream. The strategies:

- `low_confidence_dynamic`: every masked position scored above `threshold`, if they reach the step's count, else that
  many of the best (`torch.topk`, whose order among ties the reference inherits: top_k=1 scores every draw 1.0);
- `low_confidence_static`: always the step's count of the best;
- `sequential`: the step's count from the leftmost masked position on;
- `entropy_bounded`: the masked positions of least entropy while their summed entropy stays below `eb_threshold`
  (at least one). The reference raises here (its selection is never created, and its entropy sums the drawn
  tokens' probabilities over the block); this is the EB-Sampler rule it names, with each position's entropy taken
  over the distribution drawn from.

The count schedule spreads the block over `steps`: block // steps a step, one more for the first block % steps.
A step whose count exceeds the masked positions left has `torch.topk` pick given positions of the block too (tokens
revealed earlier, prompt tokens in the prompt's block), and the reference writes its fresh draws there: `overwrite`
(the preset's default) does the same, since its runs depend on it; false writes masked positions only. A drawn mask
token is written too (a masked position stays masked). Where the reference fails: temperature 0 takes the argmax
(its draw raises), and a position still masked when the steps run out is left so (it raises IndexError there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.counting import CountedNetwork
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.llada2 import filtered_logits, scheduled_counts

Strategy = Literal["low_confidence_dynamic", "low_confidence_static", "sequential", "entropy_bounded"]


def top_positions(score: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Bool [R, W]: each row's `count` [R] best positions by `score`, chosen by `torch.topk` at that count (a call
    per distinct count, so the order among ties is the one a single row's call gives)."""
    chosen = torch.zeros_like(score, dtype=torch.bool)
    for value in count.unique().tolist():
        rows = (count == value).nonzero().squeeze(1)
        best = score[rows].topk(int(value), dim=1).indices
        chosen[rows] = torch.zeros_like(chosen[rows]).scatter_(1, best, True)
    return chosen


def entropy_bounded(entropy: torch.Tensor, masked: torch.Tensor, bound: float) -> torch.Tensor:
    """Bool [R, W]: the masked positions in increasing entropy while the running sum stays below `bound` (at least
    one per row with a masked position)."""
    ordered, order = entropy.masked_fill(~masked, float("inf")).sort(1)
    below = (ordered.cumsum(1) < bound).sum(1).clamp(min=1)
    below = torch.minimum(below, masked.sum(1))
    rank = torch.arange(entropy.shape[1], device=entropy.device)[None]
    return torch.zeros_like(masked).scatter_(1, order, rank < below[:, None])


@dataclass
class SdarSampler(Sampler):
    """SDAR's in-block rule (see the module); `steps`, `strategy`, `threshold` and `eb_threshold` are the
    reference's `denoising_steps`, `remasking_strategy`, `confidence_threshold` and `eb_threshold`."""

    steps: int = 4  # steps per block (its count schedule; entropy_bounded may take up to the block's width)
    strategy: Strategy = "low_confidence_dynamic"
    threshold: float = 0.85  # low_confidence_dynamic: reveal what scores above it
    eb_threshold: float = 0.35  # entropy_bounded: the bound on the summed entropy of a step's reveals
    temperature: float = 1.0  # 0: the argmax (the reference's draw raises at 0)
    top_k: int = 0  # draw among the k most probable tokens (0: all; 1: the reference's deterministic setting)
    top_p: float = 1.0
    stop_early: bool = True  # with a stop condition: finished rows stop after their block (else only noted)
    overwrite: bool = True  # a count beyond the masked positions rewrites the given ones topk picks (see the module)

    def validate(self) -> None:
        require(self.steps >= 1, f"steps={self.steps} must be >= 1")
        require(0.0 <= self.threshold <= 1.0, f"threshold={self.threshold} must lie in [0, 1]")
        require(self.eb_threshold > 0.0, f"eb_threshold={self.eb_threshold} must be > 0")
        require(self.temperature >= 0.0, f"temperature={self.temperature} must be >= 0")
        require(self.top_k >= 0, f"top_k={self.top_k} must be >= 0")
        require(0.0 < self.top_p <= 1.0, f"top_p={self.top_p} must lie in (0, 1]")

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled:
        # the reference checks its stop tokens between blocks only: a block is always finished (the walk around this
        # rule stops the row after it); a stop met inside it is noted, not acted on
        width = canvas.tokens.shape[1]
        bounded = self.strategy == "entropy_bounded"
        batch = Batch(network, canvas, stop_early=False, max_steps=max(self.steps, width) if bounded else self.steps)
        counts = scheduled_counts(width, self.steps).to(batch.x.device)
        for step in batch:
            probs = filtered_logits(batch.logits(step, None).float(), self.temperature, self.top_k,
                                    self.top_p).softmax(-1)
            tokens = self._draw(probs, canvas, step.rows)
            masked = step.masked
            if bounded:
                entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
                chosen = entropy_bounded(entropy, masked, self.eb_threshold)
            else:
                chosen = self._scheduled(probs.gather(-1, tokens[..., None]).squeeze(-1), masked,
                                         counts[batch.steps[step.rows]])
            chosen = chosen if self.overwrite else chosen & masked
            batch.write(step, torch.where(chosen, tokens, step.state), chosen & (tokens != canvas.mask_id))
            batch.end(step)
        return batch.result()

    def _draw(self, probs: torch.Tensor, canvas: Canvas, rows: torch.Tensor) -> torch.Tensor:
        """A token per position [R, W] of batch rows `rows`: one multinomial over every position (the reference's
        call), on each row's own generator where the canvas has them (that row's call alone), or the argmax at
        temperature 0."""
        if self.temperature == 0.0:
            return probs.argmax(-1)
        own = canvas.generators_of(rows)
        if own is not None:
            return torch.cat([torch.multinomial(row, 1, generator=generator).T for row, generator in zip(probs, own)])
        flat = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=canvas.generator)
        return flat.view(probs.shape[:-1])

    def _scheduled(self, score: torch.Tensor, masked: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The positions a count-scheduled strategy reveals ([R, W]; `count` [R] this step's count per row)."""
        if self.strategy == "sequential":
            columns = torch.arange(masked.shape[1], device=masked.device)[None]
            first = torch.where(masked, columns, masked.shape[1]).min(1, keepdim=True).values
            return (columns >= first) & (columns < first + count[:, None])
        confidence = score.masked_fill(~masked, float("-inf"))
        best = top_positions(confidence, count)
        if self.strategy == "low_confidence_static":
            return best
        above = confidence > self.threshold
        return torch.where((above.sum(1) >= count)[:, None], above, best)

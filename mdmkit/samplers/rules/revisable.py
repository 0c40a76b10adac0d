"""Revisable decoding (DiffusionGemma's sampler): the canvas loop of core/canvas.py with a pluggable acceptance rule.

A step draws a token for every position of the canvas and keeps some of them; the rest go back to noise. Which it
keeps is any masked sampler's ordering x budget (`rule`), read over the whole canvas (every position is eligible at
every step, since none is ever frozen):

- EB (`rule` eb, ordering entropy; the default and the reference's `EntropyBoundSampler`): keep the longest prefix of
  the positions by ascending entropy whose entropy sum minus its largest is <= gamma.
- threshold (`tau`): keep every drawn token whose probability is >= tau (ordering confidence: the drawn token's
  probability), at least the most probable one.
- top-k (`k`): keep the k best drawn tokens each step. factor: Fast-dLLM's factor rule over the same ranking.
- steps (`steps`): keep L // steps per step and the whole draw from step `steps` on. reveal_all: keep every draw.

A rule with memory across steps of masked positions (KLASS, Credit, ...) or a loop of its own is refused, as is one
that draws (ordering random: its draws would shift the canvas's random stream) or sets knobs the loop owns
(temperature, top_p, blocks, caches, the mask token's share of the softmax).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mdmkit.core.config import require
from mdmkit.core.errors import CapabilityError
from mdmkit.models.denoiser import CANVAS
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.canvas import Acceptance, CanvasSchedule, Draw, revise
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler
from mdmkit.samplers.rules.eb import EBSampler


def acceptance(rule: MaskedSampler) -> Acceptance:
    """The acceptance rule of a masked sampler's ordering and budget: the budget's count of the best-ranked drawn
    tokens (at least one unless the rule allows empty steps). The entropy ordering sorts torch's Categorical entropies
    with torch.sort, as the reference does, so EB keeps exactly its positions."""
    budget, proxy = rule.budget(), rule.error_proxy()
    least = 0 if rule.empty_steps else 1

    def accept(draw: Draw) -> torch.Tensor:
        if rule.ordering == "entropy":
            error = draw.entropy
        else:
            error = proxy(draw.probs, draw.drawn_prob, None)
        if draw.eligible is not None:  # an in-place canvas: its givens ranked last, as padding
            error = error.masked_fill(~draw.eligible, torch.inf)
        ranked_error, order = torch.sort(error, dim=-1)
        batch, width = order.shape
        entropy, confidence = draw.entropy.gather(1, order), draw.drawn_prob.gather(1, order)
        if draw.eligible is None:
            count = torch.full((batch,), width, dtype=torch.long, device=order.device)
        else:
            count = draw.eligible.sum(-1)
            padding = torch.arange(width, device=order.device)[None, :] >= count[:, None]
            entropy, confidence = entropy.masked_fill(padding, 0.0), confidence.masked_fill(padding, 0.0)
        ranked = Ranked(entropy=entropy, confidence=confidence, n_eligible=count,
                        step_in_block=torch.full_like(count, draw.step), block_size=count, error=ranked_error)
        counts = torch.minimum(budget(ranked).clamp(min=least), count)
        ranks = torch.arange(width, device=order.device)
        return torch.zeros_like(order, dtype=torch.bool).scatter(1, order, ranks[None, :] < counts[:, None])

    return accept


def check_rule(rule: MaskedSampler) -> None:
    """Refuse, in one line, a rule that means nothing on a revisable canvas (see the module)."""
    name = type(rule).__name__
    require(type(rule).fill is MaskedSampler.fill and type(rule).fill_with is MaskedSampler.fill_with,
            f"rule {name} runs a loop of its own: a revisable canvas takes an ordering x budget rule "
            "(eb, threshold, topk, factor, steps)")
    require(rule.step_rule is None, f"rule {name} keeps memory of masked positions across steps, which a revisable "
                                    "canvas has none of: give an ordering x budget rule (eb, threshold, topk, factor)")
    require(rule.ordering != "random", "rule.ordering=random would draw from the canvas's random stream: pick "
                                       "entropy, confidence or margin")
    require(rule.temperature == 0.0 and rule.top_p == 1.0,
            "rule.temperature and rule.top_p stay 0 and 1: the canvas draws at the schedule's (t_min, t_max)")
    require(rule.block_length is None and rule.cache == "none",
            "rule.block_length and rule.cache stay null and none: the canvas is the block, the encoder the cache")
    require(not rule.mask_in_softmax, "rule.mask_in_softmax stays false: a revisable canvas has no mask token")


@dataclass
class RevisableSampler(Sampler):
    """Revisable block diffusion over a `canvas` network (see the module and core/canvas.py). The defaults are
    transformers' DiffusionGemma `generate` defaults: EB at 0.1 over 48 steps, temperature 0.8 to 0.4, stop after one
    stable step below a mean entropy of 0.005 (a checkpoint's own, from its generation_config.json, are its model
    kind's `sampler_settings`)."""

    rule: MaskedSampler = field(default_factory=lambda: EBSampler(gamma=0.1, ordering="entropy"))
    max_steps: int = 48  # decoder steps a canvas may take
    t_min: float | None = 0.4  # the schedule's temperature near the last step (null with t_max: untempered)
    t_max: float | None = 0.8  # its temperature at a canvas's first step
    stability_threshold: int | None = 1  # steps the argmax canvas must hold (null: no adaptive stop)
    confidence_threshold: float | None = 0.005  # mean entropy (nats) it must fall below (null: no adaptive stop)
    lockstep: bool = True  # a canvas waits for the rows that ended their text, as the reference (its draws)

    requires: ClassVar[frozenset[str]] = frozenset({CANVAS})

    def validate(self) -> None:
        require(self.max_steps >= 1, f"max_steps={self.max_steps} must be >= 1")
        require((self.t_min is None) == (self.t_max is None), "t_min and t_max are set together (or both null)")
        if self.t_min is not None and self.t_max is not None:
            require(self.t_min >= 0.0 and self.t_max > 0.0 and self.t_max >= self.t_min,
                    f"t_min={self.t_min}, t_max={self.t_max}: need 0 <= t_min <= t_max and t_max > 0")
        require(self.stability_threshold is None or self.stability_threshold >= 0,
                f"stability_threshold={self.stability_threshold} must be >= 0 or null")
        require(self.confidence_threshold is None or self.confidence_threshold > 0,
                f"confidence_threshold={self.confidence_threshold} must be > 0 or null")
        check_rule(self.rule)

    @property
    def schedule(self) -> CanvasSchedule:
        return CanvasSchedule(self.max_steps, self.t_min, self.t_max, self.stability_threshold,
                              self.confidence_threshold, self.lockstep)

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        if CANVAS not in network.capabilities:
            raise CapabilityError("revisable decoding needs a canvas network (hf.kind=diffusion_gemma, or one "
                                  "trained with objective=uniform_diffusion); a masked "
                                  "one decodes with a masked sampler (e.g. sampler=eb)")
        return revise(network, canvas, self.schedule, acceptance(self.rule))

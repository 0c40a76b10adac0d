"""The revisable canvas loop: block diffusion over canvases that start as uniform noise and are never frozen.

Canvas by canvas, the encoder reads what is settled (the prompt, then each finished canvas) into its cache; the
canvas starts as uniformly random tokens; each step runs the decoder over it (fed the previous step's logits),
tempers the logits on a linear schedule, draws a whole canvas from them, keeps the drawn tokens an acceptance rule
accepts and puts fresh noise everywhere else. Every step decides every position again, so nothing is revealed for
good: what a canvas settles to is the argmax of its last step. A row stops a canvas once that argmax has held for
`stability_threshold` steps and its mean entropy is below `confidence_threshold` (either None: every canvas runs
`max_steps`); a canvas holding an end-of-text id ends its row, whose later positions are padding.

The random draws follow transformers' DiffusionGemma `generate` exactly (per canvas: its noise, then per step a
multinomial draw over every position of the batch and a fresh noise canvas, all from the canvas's generator), and so
do the rows' step counts: NFE is the decoder forwards a row ran while still denoising; encoder passes are charged
beside it (`encoder`). Rows stop independently: a row that has stopped its canvas leaves the decoder's forwards (a
row's logits do not depend on the other rows of its forward: bit for bit on the CPU; a GPU may round a smaller batch
differently), while every draw is still made for the whole batch, as the reference's are, so the random stream is
the reference's.

An `in_place` network (mdmkit's own, trained on uniform noise) makes the whole sequence one canvas: its masks mark the
positions to fill, wherever they are; the givens stay, the rule ranks and the stop averages over the positions to fill
only, and no encoder runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from mdmkit.core.config import require
from mdmkit.models.canvas import CanvasSpec
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.protocol import Canvas, Sampled


class Draw:
    """One step's predictions for the whole batch, as an acceptance rule reads them."""

    def __init__(self, logits: torch.Tensor, probs: torch.Tensor, drawn: torch.Tensor, current: torch.Tensor,
                 step: int, max_steps: int, eligible: torch.Tensor | None = None) -> None:
        self.logits, self.probs = logits, probs  # [B, L, V] float32, tempered, and their softmax
        self.drawn = drawn  # [B, L] the denoiser's canvas: one draw from softmax(logits) per position
        self.current = current  # [B, L] the canvas the step started from
        self.step, self.max_steps = step, max_steps  # 0-based step of this canvas, and the most it may take
        self.eligible = eligible  # [B, L] bool: the positions a rule may rank (None: every position)

    @cached_property
    def entropy(self) -> torch.Tensor:
        """[B, L] nats, computed as torch's Categorical does (the reference's bound and stop read these values)."""
        return torch.distributions.Categorical(logits=self.logits).entropy()

    @cached_property
    def drawn_prob(self) -> torch.Tensor:
        """[B, L] the probability of each drawn token."""
        return self.probs.gather(-1, self.drawn[..., None]).squeeze(-1)

    @property
    def mean_entropy(self) -> torch.Tensor:
        """[B] the mean entropy over the eligible positions, which the adaptive stop reads."""
        if self.eligible is None:
            return self.entropy.mean(-1)
        return (self.entropy * self.eligible).sum(-1) / self.eligible.sum(-1).clamp(min=1)


Acceptance = Callable[[Draw], torch.Tensor]  # -> bool [B, L]: the drawn tokens kept (the others are renoised)


@dataclass(frozen=True)
class CanvasSchedule:
    """The loop's settings (RevisableSampler's fields). `t_min`/`t_max`: the linear temperature schedule, t_max at a
    canvas's first step falling towards t_min (either None: untempered logits). `lockstep`: a canvas's steps go on
    until every row has stopped it, rows that ended their text included, as the reference's do (its draws, and so
    every row's tokens, then equal the reference's); False saves those steps."""

    max_steps: int = 48
    t_min: float | None = 0.4
    t_max: float | None = 0.8
    stability_threshold: int | None = 1
    confidence_threshold: float | None = 0.005
    lockstep: bool = True

    def temper(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Logits at step `step` (0-based). The schedule reads the steps left as an int32 tensor, as the reference
        does, so the temperature is the same float32 value."""
        if self.t_min is None or self.t_max is None:
            return logits
        left = torch.tensor(self.max_steps - step, dtype=torch.int32, device=logits.device)
        return logits / (self.t_min + (self.t_max - self.t_min) * (left / self.max_steps))

    @property
    def stops(self) -> bool:
        return self.stability_threshold is not None and self.confidence_threshold is not None


def answer_start(canvas: Canvas) -> int:
    """The first column of the answer: the trailing columns every row leaves to fill (one line if there are none, or
    if masks sit elsewhere)."""
    masked = canvas.tokens == canvas.mask_id
    filled = (~masked).any(0).nonzero()
    start = int(filled[-1]) + 1 if filled.numel() else 0
    require(start < canvas.tokens.shape[1], "the canvas has no positions to fill (no trailing mask_id columns)")
    require(start > 0, "a revisable canvas continues a prompt: give at least one token before the answer")
    require(not bool(masked[:, :start].any()), "a revisable canvas fills the trailing answer only: every row's "
                                                "mask_id positions must be its last columns")
    return start


def in_place(canvas: Canvas, spec: CanvasSpec) -> torch.Tensor:
    """The positions an in-place canvas fills [B, L]: its mask_id positions (one line where the sizes disagree)."""
    require(canvas.tokens.shape[1] == spec.length,
            f"an in-place canvas is the whole sequence: {canvas.tokens.shape[1]} tokens, the network's {spec.length}")
    require(canvas.attention_mask is None, "an in-place canvas has no padding to hide")
    return canvas.tokens == canvas.mask_id


def _settle(settled: torch.Tensor, ended: torch.Tensor, eos: torch.Tensor | None,
            pad_id: int | None) -> torch.Tensor:
    """A finished canvas [B, L] as its rows keep it: rows ended before are all padding, and whatever follows a row's
    first end-of-text id is padding (with no pad id: as decoded). Returns the rows that end in it."""
    if eos is None:
        return torch.zeros_like(ended)
    if pad_id is not None:
        settled[ended] = pad_id
        is_end = torch.isin(settled, eos)
        seen = is_end.long().cumsum(1)
        settled[(seen > 1) | ((seen == 1) & ~is_end)] = pad_id
    return ~ended & torch.isin(settled, eos).any(1)


def _decode(network: ForwardCounter, state: Any, running: torch.Tensor, needed: torch.Tensor,
            current: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """The step's logits [B, L, V]: the decoder runs only the rows whose output is used (`needed`); the others'
    logits are zeros, read by nothing but draws made for the whole batch so that the random stream stays the same."""
    every = torch.arange(current.shape[0], device=current.device)
    if bool(needed.all()):
        return network.decode(every[running], state, current, previous)
    view = every[needed]
    part = network.decode(every[running], state, current[view], None if previous is None else previous[view], view)
    logits = part.new_zeros((current.shape[0], *part.shape[1:]))
    logits[view] = part
    return logits


def revise(network: ForwardCounter, canvas: Canvas, schedule: CanvasSchedule, accept: Acceptance) -> Sampled:
    """Fill the trailing answer of `canvas` (its mask_id columns) canvas by canvas (see the module)."""
    spec, generator = network.canvas, canvas.generator
    tokens = canvas.tokens.clone()
    fill = in_place(canvas, spec) if spec.in_place else None
    start = 0 if fill is not None else answer_start(canvas)
    batch, width = tokens.shape[0], spec.length
    device = tokens.device
    n_answer = tokens.shape[1] - start
    if fill is not None:
        state = network.open_canvas(tokens, ~fill)
    else:
        keep = None if canvas.attention_mask is None else canvas.attention_mask[:, :start]
        state = network.open_canvas(tokens[:, :start], keep)
    eos = torch.tensor(spec.eos_ids, device=device) if spec.eos_ids else None
    filler = spec.pad_id if spec.pad_id is not None else canvas.mask_id

    def needed(done: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        """The rows a step's forward must run: those still denoising, and under lockstep the ended rows too (their
        stop decides how long the canvas runs). With stopping off, an ended row's canvas is never frozen, and its
        logits are as unused as a stopped row's."""
        return ~done if schedule.lockstep else ~(done | ended)

    every = torch.arange(batch, device=device)
    confidence = schedule.confidence_threshold if schedule.confidence_threshold is not None else 0.0
    ended = torch.zeros(batch, dtype=torch.bool, device=device)  # rows whose text has ended (or met `stop`)
    stopped = torch.zeros_like(ended)  # rows that met `canvas.stop`
    steps = torch.zeros(batch, dtype=torch.long, device=device)
    reveal_step = torch.full_like(tokens, -1)
    answer = torch.zeros_like(tokens, dtype=torch.bool)
    answer[:, start:] = True
    if fill is not None:
        answer = fill.clone()
    context = tokens[:, :start]
    for index in range(math.ceil(n_answer / width)):
        if fill is None:
            network.encode(every[~ended], state, context)
        current = torch.randint(0, spec.vocab_size, (batch, width), device=device, generator=generator)
        argmax, previous = current, None
        done = torch.zeros_like(ended)  # rows that have stopped this canvas
        history = torch.full((schedule.stability_threshold or 0, batch, width), -1, dtype=torch.long, device=device)
        for step in range(schedule.max_steps):
            running = ~(done | ended)  # charged: the rows still writing their text
            logits = schedule.temper(_decode(network, state, running, needed(done, ended), current, previous), step)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            drawn = torch.multinomial(probs.view(-1, spec.vocab_size), 1, generator=generator).view(batch, width)
            draw = Draw(logits, probs, drawn, current, step, schedule.max_steps, fill)
            kept = accept(draw) if fill is None else accept(draw) | ~fill  # a given is drawn as itself
            noise = torch.randint(0, spec.vocab_size, (batch, width), device=device, generator=generator)
            new_current = torch.where(kept, drawn, noise)
            new_argmax = logits.argmax(-1)
            if schedule.stops:
                frozen = done[:, None]
                new_argmax = torch.where(frozen, argmax, new_argmax)
                new_current = torch.where(frozen, current, new_current)
                assert previous is not None or not bool(done.any())  # rows stop only after a step
                logits = logits if previous is None else torch.where(frozen[..., None], previous, logits)
                stable = (history == new_argmax[None]).all(-1).all(0)
                if history.shape[0]:
                    history = torch.cat([history[1:], new_argmax[None]])
                confident = draw.mean_entropy < confidence  # (frozen rows: unused)
                done = done | (stable & confident)
            current, argmax, previous = new_current, new_argmax, logits
            steps += running.long()
            if bool((done if schedule.lockstep else done | ended).all()):
                break
        settled = argmax.clone()
        if not schedule.lockstep and spec.pad_id is None:
            settled[ended] = filler  # rows that ended before this canvas were not decoded in it
        newly = _settle(settled, ended, eos, spec.pad_id)
        columns = slice(start + index * width, min(start + (index + 1) * width, tokens.shape[1]))
        tokens[:, columns] = settled[:, : columns.stop - columns.start]
        reveal_step[:, columns] = (steps - 1).clamp(min=0)[:, None]
        if fill is not None:
            tokens = torch.where(fill, tokens, canvas.tokens)
            reveal_step = torch.where(fill, reveal_step, -1)
        ended |= newly
        if canvas.stop is not None:
            met = ~stopped & canvas.stop.met(tokens, answer, canvas.mask_id)
            network.mark_stopped(every[met])
            stopped |= met
            if not schedule.lockstep:
                ended |= met
        if bool(ended.all()):
            tokens[:, columns.stop:] = filler
            reveal_step[:, columns.stop:] = (steps - 1).clamp(min=0)[:, None]
            break
        context = settled
    return Sampled(tokens, reveal_step, steps)


def tokens_per_forward(sampled: Sampled, start: int, nfe: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Per row: answer tokens that are not padding over decoder forwards (the reference's `tokens_per_forward`)."""
    new = sampled.tokens[:, start:]
    valid = (new != pad_id).sum(-1) if pad_id is not None else torch.full_like(nfe, new.shape[1])
    return valid / nfe.to(new.device)

"""SlowFast sampling: cycles of a slow, exploratory phase that finds a stable span and a fast phase that fills it.

Wei et al. 2025, arXiv 2506.10848; code: LiangrunFlora/Slow-Fast-Sampling (`generate_slow_fast_sampling`, its LLaDA
path), which is followed where the paper's text differs. Inside a block a cycle starts at offset s: the slow phase
reveals what is confident and predicts the span's end until a window of predictions is stable; the fast phase fills
the span [s, end), and the next cycle starts at its end. Offsets count a block's answer positions in reading order;
every forward reveals at least one. The rule, its defaults and departures: docs/samplers.md ("SlowFast sampling").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.blocks import best_of, check_sampling_fields, eligible_span
from mdmkit.samplers.core.choice import choose_in_span
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.kv_cache import CacheMode
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler


def block_offsets(answer: torch.Tensor, block_length: int | None) -> torch.Tensor:
    """Per position of `answer` [B, L]: its offset among its block's answer positions (-1 off the answer)."""
    rank = (answer.long().cumsum(1) - 1).clamp(min=0)
    return torch.where(answer, rank if block_length is None else rank % block_length, -1)


@dataclass
class _Cycles:
    """Each batch row's place in its current cycle (offsets count the block's answer positions)."""

    start: torch.Tensor  # [B] the cycle's first offset
    end: torch.Tensor  # [B] one past the span's last offset (meaningful once `settled`)
    fast: torch.Tensor  # [B] bool: in the fast phase
    explored: torch.Tensor  # [B] slow steps taken in this cycle
    settled: torch.Tensor  # [B] bool: the span's end is fixed
    fast_steps: torch.Tensor  # [B] fast steps taken in this cycle
    history: torch.Tensor  # [B, window] the latest end predictions (a ring)
    predicted: torch.Tensor  # [B] predictions made in this cycle

    @classmethod
    def empty(cls, batch: int, window: int, device: torch.device) -> _Cycles:
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(zeros.clone(), zeros.clone(), zeros.bool(), zeros.clone(), zeros.bool(), zeros.clone(),
                   torch.zeros(batch, window, dtype=torch.long, device=device), zeros.clone())

    def restart(self, rows: torch.Tensor, start: torch.Tensor) -> None:
        """Begin a new cycle (slow phase, nothing predicted) at offset `start` for `rows`."""
        self.start[rows] = start
        self.fast[rows] = False
        self.explored[rows] = 0
        self.settled[rows] = False
        self.predicted[rows] = 0


@dataclass
class SlowFastSampler(Sampler):
    """SlowFast sampling: slow exploration to a stable span, fast threshold decoding inside it (see the module)."""

    min_confidence: float = 0.1  # tau_min_conf: the span reaches the farthest masked position at least this confident
    high_confidence: float = 0.85  # tau_high_conf: positions at least this confident are revealed together
    explore_steps: int = 8  # K_max: slow steps per cycle
    window: int = 2  # W_hist: end predictions whose variance decides stability
    stable_variance: float = 1.0  # sigma^2_stable: the end is settled once the window's variance is below this
    slow_k: int = 1  # a slow step reveals at least this many positions
    fast_k: int = 1  # a fast step reveals at least this many positions
    explore_until_stable: bool = False  # true: the fast phase starts as soon as the end is settled (the paper's text)
    span_cache: bool = False  # fast forwards after the first run the canvas only up to the span's end (the code's)
    temperature: float = 0.0  # 0: argmax; > 0: sample from softmax(logits / T)
    top_p: float = 1.0
    block_length: int | None = None  # semi-autoregressive blocks over the answer positions (None: one block)
    stop_early: bool = True  # with a stop condition: finished rows stop computing (else only the point is noted)
    cache: CacheMode = "none"  # only none (see span_cache)

    def validate(self) -> None:
        require(0.0 <= self.min_confidence <= 1.0, f"min_confidence={self.min_confidence} must lie in [0, 1]")
        require(0.0 <= self.high_confidence <= 1.0, f"high_confidence={self.high_confidence} must lie in [0, 1]")
        require(self.explore_steps >= 1, f"explore_steps={self.explore_steps} must be >= 1")
        require(self.window >= 1, f"window={self.window} must be >= 1")
        require(self.stable_variance >= 0.0, f"stable_variance={self.stable_variance} must be >= 0")
        require(self.slow_k >= 1, f"slow_k={self.slow_k} must be >= 1")
        require(self.fast_k >= 1, f"fast_k={self.fast_k} must be >= 1")
        check_sampling_fields(self.temperature, self.top_p, self.block_length)
        require(self.cache == "none", f"cache={self.cache} is not supported by SlowFast (its own out-of-span cache "
                                      f"is span_cache): use cache=none")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill `canvas` (see `Sampler.sample`) block by block, in slow and fast cycles; one forward per step."""
        batch = Batch(network, canvas, stop_early=self.stop_early, block_length=self.block_length)
        offset_of = block_offsets(batch.answer, self.block_length)
        cycles = _Cycles.empty(batch.x.shape[0], self.window, batch.x.device)
        for step in batch:
            rows, row_masked = step.rows, step.masked
            offset = torch.where(step.in_block, offset_of[rows], -1)
            in_span = self._next_phase(cycles, rows, step.entered, row_masked, offset)

            fast = cycles.fast[rows]
            pool = row_masked & (offset >= cycles.start[rows, None]) & torch.where(fast[:, None], in_span, True)
            cut = fast & (cycles.fast_steps[rows] > 0) if self.span_cache else torch.zeros_like(fast)
            choice, confidence = self._forward(network, canvas, rows, step.state, step.eligible, in_span, cut)

            exploring = ~fast & ~cycles.settled[rows]  # slow rows whose span end is still open
            if bool(exploring.any()):
                self._predict_end(cycles, rows[exploring], pool[exploring], offset[exploring], confidence[exploring])
            least = torch.where(fast, self.fast_k, self.slow_k)
            high = (pool & (confidence >= self.high_confidence)).sum(1)
            batch.reveal(step, best_of(confidence, pool, torch.maximum(high, least), descending=True), choice)
            cycles.explored[rows] += (~fast).long()
            cycles.fast_steps[rows] += fast.long()
            batch.end(step)
        return batch.result()

    def _next_phase(self, cycles: _Cycles, rows: torch.Tensor, entered: torch.Tensor, row_masked: torch.Tensor,
                    offset: torch.Tensor) -> torch.Tensor:
        """Move `rows` to this step's phase; returns their span's positions [R, L] (the fast phase's pool)."""
        cycles.restart(rows[entered], torch.zeros_like(rows[entered]))
        slow = ~cycles.fast[rows]
        done_exploring = cycles.explored[rows] >= self.explore_steps
        if self.explore_until_stable:
            done_exploring |= cycles.settled[rows]
        to_fast = rows[slow & done_exploring]
        cycles.fast[to_fast] = True
        cycles.fast_steps[to_fast] = 0
        in_span = (offset >= cycles.start[rows, None]) & (offset < cycles.end[rows, None])
        filled = cycles.fast[rows] & ~(in_span & row_masked).any(1)  # the span is full: a new cycle starts at its end
        cycles.restart(rows[filled], cycles.end[rows[filled]])
        return (offset >= cycles.start[rows, None]) & (offset < cycles.end[rows, None])

    def _predict_end(self, cycles: _Cycles, slow: torch.Tensor, pool: torch.Tensor, offset: torch.Tensor,
                     confidence: torch.Tensor) -> None:
        """One slow step's end prediction for batch rows `slow` (their pools, offsets and confidences [S, L]).

        The guess never passes the block's end (the code clamps it there): the pool lies inside the block, and
        start + 1 is at most its size while the block holds a mask at an offset >= start."""
        reach = pool & (confidence >= self.min_confidence)
        farthest = torch.where(reach, offset, -1).max(1).values
        guess = torch.where(farthest >= 0, farthest + 1, cycles.start[slow] + 1)
        cycles.history[slow, cycles.predicted[slow] % self.window] = guess
        cycles.predicted[slow] += 1
        n = cycles.predicted[slow].clamp(max=self.window)
        held = torch.arange(self.window, device=guess.device)[None, :] < n[:, None]
        values = torch.where(held, cycles.history[slow], 0)
        total = values.sum(1)
        mean = total.double() / n
        variance = (torch.where(held, values.double() - mean[:, None], 0.0) ** 2).sum(1) / n
        stable = (cycles.predicted[slow] >= self.window) & (variance < self.stable_variance)
        cycles.end[slow] = torch.where(stable, guess, total // n)
        cycles.settled[slow] = stable | (cycles.explored[slow] + 1 >= self.explore_steps)

    def _forward(self, network: ForwardCounter, canvas: Canvas, rows: torch.Tensor, state: torch.Tensor,
                 candidates: torch.Tensor, in_span: torch.Tensor,
                 cut: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of `rows`; returns the chosen tokens and their confidences [R, L] at the `candidates` (the
        block's masks; elsewhere mask and 0). Rows `cut` run the canvas only up to their span's last position (the
        forward is as wide as the widest row; the rest is hidden)."""
        length = state.shape[1]
        columns = torch.arange(length, device=state.device)
        last = torch.where(in_span, columns, -1).max(1).values
        need = torch.where(cut, last + 1, length)
        width = int(need.max())
        keep = columns[None, :width] < need[:, None]
        if canvas.attention_mask is not None:
            keep = keep & canvas.attention_mask[rows][:, :width].bool()
        hides = canvas.attention_mask is not None or bool((need < length).any())
        kwargs = {"attn_mask": keep[:, None, None, :]} if hides else {}
        span = eligible_span(candidates[:, :width])
        logits = network(state[:, :width], rows, logits_at=span, **kwargs)
        choice, confidence = choose_in_span(logits, span, width, canvas.mask_id, self.temperature, self.top_p,
                                            canvas.generator, torch.float64)
        pad = length - width
        return (torch.nn.functional.pad(choice, (0, pad), value=canvas.mask_id),
                torch.nn.functional.pad(confidence, (0, pad), value=0.0))

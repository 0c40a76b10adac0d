"""Budget rules: how many of this step's sorted eligible positions to reveal, per row.

A rule sees a `Ranked` view (eligible positions sorted best first by the error proxy) and returns a count
per row; the loop then reveals at least one (none where a sampler allows `empty_steps`, as Dream's schedule
does) and at most all eligible positions. Top-k, step schedules,
EB-Sampler, Fast-dLLM threshold and factor (the paper's rule and its code's) differ only here. Each rule checks
the ranges of its own parameters, once for every sampler that uses it (a bad value is a `ConfigError` naming the
field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mdmkit.core.config import require


@dataclass
class Ranked:
    """One step's eligible positions, sorted best first; columns past `n_eligible` are padding."""

    entropy: torch.Tensor  # [R, L] nats, in ranked order (padding: 0)
    confidence: torch.Tensor  # [R, L] probability of the chosen token, in ranked order (padding: 0)
    n_eligible: torch.Tensor  # [R]
    step_in_block: torch.Tensor  # [R] steps already taken in the current block
    block_size: torch.Tensor  # [R] eligible positions when the current block started
    error: torch.Tensor | None = None  # [R, L] the ordering's scores, ascending (padding: inf); None: not given

    @property
    def valid(self) -> torch.Tensor:
        columns = torch.arange(self.confidence.shape[1], device=self.confidence.device)
        return columns[None, :] < self.n_eligible[:, None]


class Budget(Protocol):
    def __call__(self, ranked: Ranked) -> torch.Tensor:
        """Number of leading ranked positions to reveal, per row (clamped to [1, n_eligible] by the loop, or
        to [0, n_eligible] with `empty_steps`)."""


def _prefix_length(holds: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row."""
    return holds.long().cumprod(1).sum(1)


@dataclass(frozen=True)
class FixedCount:
    """Top-k: k positions per step."""

    k: int

    def __post_init__(self) -> None:
        require(self.k >= 1, f"k={self.k} must be >= 1")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return torch.full_like(ranked.n_eligible, self.k)


@dataclass(frozen=True)
class StepSchedule:
    """A fixed number of steps per block, the block's positions spread evenly (LLaDA's schedule).

    With n positions and s steps, step i reveals n // s, plus one for the first n % s steps.
    """

    steps: int

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"steps={self.steps} must be >= 1")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        base, extra = ranked.block_size // self.steps, ranked.block_size % self.steps
        count = base + (ranked.step_in_block < extra).long()
        last = ranked.step_in_block >= self.steps - 1  # the last step (or past it) finishes the block
        return torch.where(last, ranked.n_eligible, count)


@dataclass(frozen=True)
class DreamSchedule:
    """Dream's schedule: at step i of s, reveal int(n_masked * (1 - t_{i+1} / t_i)), t = linspace(1, eps, s + 1).

    In float32, as Dream computes it: in float64 the product lands on the other side of an integer now and then.
    `random_count` is Dream's alg='origin' instead: each eligible position is revealed on its own with probability
    1 - t_{i+1} / t_i, i.e. exactly the positions whose uniform draw (the `random` ordering's score) is below it.
    """

    steps: int
    eps: float = 1e-3
    random_count: bool = False

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"steps={self.steps} must be >= 1")
        require(0.0 < self.eps < 1.0, f"eps={self.eps} must lie in (0, 1)")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        times = torch.linspace(1.0, self.eps, self.steps + 1, dtype=torch.float32)
        step = ranked.step_in_block.clamp(max=self.steps - 1).cpu()
        fraction = (1.0 - times[step + 1] / times[step]).to(ranked.n_eligible.device)
        if self.random_count:
            if ranked.error is None:
                raise ValueError("DreamSchedule(random_count=True) needs the ranked scores (the random draws)")
            count = ((ranked.error < fraction[:, None]) & ranked.valid).sum(1)
        else:
            count = (ranked.n_eligible.float() * fraction).long()
        return torch.where(ranked.step_in_block >= self.steps - 1, ranked.n_eligible, count)


@dataclass(frozen=True)
class EntropyBound:
    """EB-Sampler (Ben-Hamu et al. 2025, eq. 2): the largest ranked prefix S with
    sum_{i in S} H_i - max_{i in S} H_i <= gamma. gamma = 0 reveals one token (unless ties at zero entropy)."""

    gamma: float

    def __post_init__(self) -> None:
        require(self.gamma >= 0.0, f"gamma={self.gamma} must be >= 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        entropy = ranked.entropy.masked_fill(~ranked.valid, 0.0)
        excess = entropy.cumsum(1) - entropy.cummax(1).values  # non-decreasing along the prefix
        return ((excess <= self.gamma) & ranked.valid).sum(1)


@dataclass(frozen=True)
class ConfidenceThreshold:
    """Fast-dLLM threshold: every ranked position whose confidence is >= tau (a prefix under confidence order)."""

    tau: float

    def __post_init__(self) -> None:
        require(0.0 < self.tau <= 1.0, f"tau={self.tau} must lie in (0, 1]")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return _prefix_length((ranked.confidence >= self.tau) & ranked.valid)


@dataclass(frozen=True)
class ConfidenceFactor:
    """Fast-dLLM's factor rule as its paper states it: the largest n with (n + 1) * (1 - c_(n)) < f, c_(n) the
    n-th ranked confidence (none: the loop reveals one). `FastDllmFactor` is the rule as its code applies it."""

    factor: float

    def __post_init__(self) -> None:
        require(self.factor > 0.0, f"factor={self.factor} must be > 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        n = torch.arange(1, ranked.confidence.shape[1] + 1, device=ranked.confidence.device)
        holds = (n[None, :] + 1) * (1.0 - ranked.confidence) < self.factor
        return _prefix_length(holds & ranked.valid)


@dataclass(frozen=True)
class FastDllmFactor:
    """Fast-dLLM's factor rule as its code applies it (`get_transfer_index_dynamic`, NVlabs/Fast-dLLM).

    Ranked position n (1-based) passes when c_(n) >= 1 - f / (n + 1), compared in float64; the first always
    passes. The count is the leading run of passes, except that a run covering all but the last eligible
    position reveals the last one too. Against `ConfidenceFactor`: `>=` where the paper has a strict `<`, and
    that last rule, so two masked positions are always revealed together.
    """

    factor: float

    def __post_init__(self) -> None:
        require(self.factor > 0.0, f"factor={self.factor} must be > 0")

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        n = torch.arange(1, ranked.confidence.shape[1] + 1, device=ranked.confidence.device, dtype=torch.float64)
        passes = ranked.confidence.double() >= 1.0 - self.factor / (n[None, :] + 1.0)
        passes[:, 0] = True
        run = _prefix_length(passes & ranked.valid)
        return torch.where(run >= ranked.n_eligible - 1, ranked.n_eligible, run)


@dataclass(frozen=True)
class RevealAll:
    """Every eligible position at once (one-shot decoding of a block)."""

    def __call__(self, ranked: Ranked) -> torch.Tensor:
        return ranked.n_eligible.clone()

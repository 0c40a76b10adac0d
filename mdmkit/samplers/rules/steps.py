"""Step schedules: LLaDA's even spread of a block's positions over `steps` steps, and Dream's timestep schedule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import require
from mdmkit.samplers.core.budget import Ranked
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.ordering import ErrorProxy, entropy_with_eps


@dataclass(frozen=True)
class StepSchedule:
    """LLaDA's schedule: with n positions in a block and s steps, step i reveals n // s, one more for i < n % s."""

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
    """Dream's schedule: at step i of s, reveal int(n_masked * (1 - t_{i+1} / t_i)), t = linspace(1, eps, s + 1), in
    float32 as Dream computes it (float64 sometimes rounds the other way). `random_count` (Dream's alg='origin')
    reveals instead the positions whose uniform draw (the `random` ordering's score) is below 1 - t_{i+1} / t_i."""

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


@dataclass
class StepsSampler(MaskedSampler):
    """A fixed number of steps per block, positions spread evenly over them (LLaDA's schedule)."""

    budget_rule = StepSchedule
    steps: int = 16


@dataclass
class DreamStepsSampler(MaskedSampler):
    """Dream's timestep schedule over `steps` steps (see DreamSchedule). The `dream_*` presets also set what Dream's
    `diffusion_generate` does beyond it: `empty_steps`, `mask_in_softmax`, `random_count` (alg='origin') and
    `entropy_eps` (the entropy order scores -sum p log(p + eps), Dream's 1e-10; 0: the exact entropy)."""

    budget_rule = DreamSchedule
    steps: int = 64
    eps: float = DreamSchedule.eps
    empty_steps: bool = False
    entropy_eps: float = 0.0
    random_count: bool = DreamSchedule.random_count  # True only for alg="origin" (dream_origin)

    def validate(self) -> None:
        super().validate()
        require(self.entropy_eps >= 0.0, f"entropy_eps={self.entropy_eps} must be >= 0")
        require(not self.random_count or self.ordering == "random",
                f"random_count=true needs ordering=random (Dream's alg='origin'), not ordering={self.ordering}")

    def error_proxy(self) -> ErrorProxy:
        if self.ordering == "entropy" and self.entropy_eps > 0.0:
            return entropy_with_eps(self.entropy_eps)
        return super().error_proxy()

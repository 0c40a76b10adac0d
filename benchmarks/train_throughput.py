"""How many training steps a second a run's config takes on a device: what a device call of fixed length buys.

The step is the one `MDMModule.training_step` takes under Lightning (the run's objective on its `train_network`,
bf16 autocast as `precision: bf16-mixed` gives it, gradient clipping at 1, AdamW, the EMA update, a batch moved
from the CPU each step), timed without the Trainer so that compilation and warm-up stay out of the rate.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from mdmkit.core.seeding import seeded_generator
from mdmkit.tasks.base import Split
from mdmkit.training.module import MDMModule

_SYNC_EVERY = 10  # steps between host-device synchronisations while timing (the queue never runs far ahead)


@dataclass
class StepRate:
    """Steps timed after warm-up; `first_step_s` holds the first step alone (compilation, allocator, kernels)."""

    batch_size: int
    seq_len: int
    compiled: bool
    bf16: bool
    steps: int
    seconds: float
    first_step_s: float
    parameters: int
    peak_memory_gib: float | None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def examples_per_s(self) -> float:
        return self.steps_per_s * self.batch_size

    @property
    def model_tflops(self) -> float:
        """6 x parameters x tokens per second (the dense arithmetic of forward and backward; attention left out)."""
        return 6 * self.parameters * self.examples_per_s * self.seq_len / 1e12

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "steps_per_s": self.steps_per_s, "examples_per_s": self.examples_per_s,
                "model_tflops": self.model_tflops}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_training_steps(config: dict[str, Any], pool: Split, batch_size: int, device: torch.device, bf16: bool,
                        seconds: float, warmup_steps: int = 3) -> StepRate:
    """Build the run's module from `config` (its `compile` key decides compilation), then take training steps on
    batches drawn from `pool` until `seconds` have passed after `warmup_steps`; at least `_SYNC_EVERY` are timed."""
    torch.compiler.reset()  # each setting compiles afresh: no graph made dynamic by an earlier batch size
    module = MDMModule.from_config(config).to(device)
    optimizer = module.optim.adamw(module.network)
    draws = torch.Generator().manual_seed(0)
    noise = seeded_generator(0, device)

    def step(number: int) -> None:
        index = torch.randint(len(pool), (batch_size,), generator=draws)
        batch = (pool.tokens[index], pool.answer_mask[index])
        if device.type == "cuda":  # pinned, as the training loader gives a GPU its batches
            batch = tuple(column.pin_memory() for column in batch)
        # non-blocking, as Lightning moves a batch to a GPU
        tokens, answer_mask = (column.to(device, non_blocking=True) for column in batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module.objective(module.train_network, tokens, answer_mask, module.task.mask_id, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.network.parameters(), 1.0)  # as gradient_clip_val=1
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        module.ema.update(module.network, number)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    step(0)
    _synchronize(device)
    first = time.perf_counter() - started
    for number in range(1, 1 + warmup_steps):
        step(number)
    _synchronize(device)
    number, started = 1 + warmup_steps, time.perf_counter()
    while True:
        for _ in range(_SYNC_EVERY):
            step(number)
            number += 1
        _synchronize(device)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return StepRate(batch_size, pool.tokens.shape[1], bool(config.get("compile")), bf16,
                    number - 1 - warmup_steps, elapsed, first, module.network.num_parameters(), peak)

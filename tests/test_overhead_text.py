"""The text-model overhead benchmark's clock: which forwards it times, what it calls a step, when it stops."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.overhead_text import EnoughSteps, StepClock, canvas, time_steps
from mdmkit.samplers import RevealAllSampler, TopKSampler

VOCAB, MASK = 6, 5


class SlowUniform(torch.nn.Module):
    """Uniform logits after sleeping `seconds`: a forward of known length."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.calls = 0

    def forward(self, tokens: torch.Tensor, **_) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.seconds)
        return torch.zeros(*tokens.shape, VOCAB)


def test_the_clock_times_the_first_steps_then_stops_the_run():
    network = SlowUniform(0.1)
    tokens = canvas(batch=2, prompt=3, answer=8, vocab_size=VOCAB, mask_id=MASK)
    clock = time_steps(TopKSampler(k=1), network, tokens, MASK, steps=3)
    assert network.calls == 3  # the fourth call is refused before it reaches the network
    assert len(clock.forward_seconds) == 3 and len(clock.step_seconds) == 3
    assert all(s >= 0.1 for s in clock.forward_seconds)
    assert all(0.0 < s < 0.1 for s in clock.step_seconds)  # the loop's work (~1 ms), not the network's sleeps


def test_a_gap_is_the_time_between_a_forwards_end_and_the_next_start():
    clock = StepClock(lambda *a, **k: None, forwards=2)
    clock()
    time.sleep(0.03)
    clock()
    with pytest.raises(EnoughSteps):
        clock()
    assert len(clock.step_seconds) == 2 and clock.step_seconds[0] >= 0.03


def test_a_run_shorter_than_the_timed_steps_is_an_error():
    tokens = canvas(batch=1, prompt=2, answer=4, vocab_size=VOCAB, mask_id=MASK)
    with pytest.raises(RuntimeError, match="fewer than the 3 timed"):
        time_steps(RevealAllSampler(), SlowUniform(0.0), tokens, MASK, steps=3)


def test_the_canvas_is_prompt_then_masks_and_the_prompt_never_holds_the_mask():
    tokens = canvas(batch=4, prompt=50, answer=7, vocab_size=VOCAB, mask_id=MASK)
    assert tokens.shape == (4, 57)
    assert not (tokens[:, :50] == MASK).any() and (tokens[:, 50:] == MASK).all()

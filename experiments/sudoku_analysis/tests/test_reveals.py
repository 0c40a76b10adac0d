"""reveals: a traced Top-1 run on a toy model with known confidences, and the first wrong reveal of each row
read off it exactly."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import FixedConfidence

from experiments.sudoku_analysis.reveals import TracingCounter, first_wrong_reveals
from mdmkit.samplers import TopKSampler

CONF = [0.9, 0.6, 0.8, 0.7]  # Top-1 by confidence reveals positions 0, 2, 3, 1; position i predicts token i


def entropy_of(c: float, others: int = 4) -> float:
    """The toy's entropy with the mask excluded: c on one token, the rest spread over `others`."""
    return -c * math.log(c) - (1 - c) * math.log((1 - c) / others)


def test_first_wrong_reveals_of_a_traced_top1_run() -> None:
    network = FixedConfidence(CONF)
    mask = network.mask_id
    target = torch.tensor([[0, 1, 4, 3],    # position 2 wrong: revealed second
                           [0, 1, 2, 3],    # all right
                           [1, 1, 2, 3]])   # position 0 wrong: revealed first
    counter = TracingCounter(network, 3, mask)
    final = TopKSampler(k=1, ordering="confidence").sample(counter, torch.full_like(target, mask), mask).tokens
    assert final.tolist() == [[0, 1, 2, 3]] * 3
    assert len(counter.trace) == 4 and counter.trace[0].rows.tolist() == [0, 1, 2]
    assert counter.trace[0].entropies[0].tolist() == pytest.approx([entropy_of(c) for c in CONF], abs=1e-5)

    found = first_wrong_reveals(counter.trace, final, target, mask)
    assert [(f.row, f.step) for f in found] == [(0, 1), (2, 0)]
    second, first = found
    assert second.before.tolist() == [0, mask, mask, mask]  # what the model saw: position 0 revealed, right
    assert second.revealed.tolist() == [False, False, True, False] == second.wrong.tolist()
    assert second.free_is_wrong and second.free_entropy == pytest.approx(entropy_of(0.8), abs=1e-5)
    assert first.before.tolist() == [mask] * 4 and first.wrong.tolist() == [True, False, False, False]


def test_a_row_right_everywhere_has_no_wrong_reveal() -> None:
    network = FixedConfidence(CONF)
    target = torch.tensor([[0, 1, 2, 3]])
    counter = TracingCounter(network, 1, network.mask_id)
    final = TopKSampler(k=1).sample(counter, torch.full_like(target, network.mask_id), network.mask_id).tokens
    assert first_wrong_reveals(counter.trace, final, target, network.mask_id) == []

"""AUP (d3LLM's area under the accuracy-parallelism curve) against hand-worked values."""

from __future__ import annotations

import math

import pytest

from mdmkit.analysis.aup import aup, family_aup, quality_weight
from mdmkit.core.errors import ConfigError


def test_one_point_is_its_rectangle_and_the_weight_only_penalises_lost_accuracy():
    assert aup([(3.0, 70.0)], best=90.0) == pytest.approx(210.0)  # the first point is not weighted
    assert quality_weight(90.0, 90.0) == 1.0 and quality_weight(95.0, 90.0) == 1.0
    assert quality_weight(80.0, 90.0) == pytest.approx(math.exp(-1 / 3))


def test_points_are_sorted_by_parallelism_weighted_and_cut_five_points_below_the_first():
    points = [(8.0, 60.0), (2.0, 88.0), (4.0, 80.0), (1.0, 90.0)]  # 80 and 60 fall below 90 - 5
    expected = 1.0 * 90.0 + 0.5 * (2.0 - 1.0) * (88.0 * math.exp(-3 * (1 - 88 / 90)) + 90.0)
    assert aup(points, best=90.0) == pytest.approx(expected) == pytest.approx(176.1623, abs=1e-4)
    # a wider drop keeps (4, 80): one more trapezoid with both ends weighted
    wider = expected + 0.5 * 2.0 * (80.0 * math.exp(-3 * (1 - 80 / 90)) + 88.0 * math.exp(-3 * (1 - 88 / 90)))
    assert aup(points, best=90.0, y_drop=10.0) == pytest.approx(wider)


def test_family_aup_uses_the_best_accuracy_of_all_families_and_skips_the_oracle():
    def row(family: str, accuracy: float, tokens_per_step: float | None, kind: str = "evaluate") -> dict:
        return {"family": family, "accuracy": accuracy, "tokens_per_step": tokens_per_step, "kind": kind}

    rows = [row("a", 0.90, 1.0), row("a", 0.88, 2.0), row("b", 0.80, 4.0), row("oracle", 0.99, 9.0, "oracle"),
            row("c", 0.5, None)]
    scores = family_aup(rows, lambda r: r["family"])
    assert set(scores) == {"a", "b"}
    assert scores["a"] == pytest.approx(176.1623, abs=1e-4)
    assert scores["b"] == pytest.approx(4.0 * 80.0)  # its one point; best accuracy 90 is a's


def test_bad_points_are_one_error():
    with pytest.raises(ConfigError, match="must be > 0"):
        aup([(0.0, 50.0)], best=90.0)
    with pytest.raises(ConfigError, match="no points"):
        aup([], best=90.0)

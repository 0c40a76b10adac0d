"""Statistics of accuracies measured on a finite sample: how sure a number is, and whether two models differ.

Evaluation rows record the interval (`accuracy_ci95`); studies compare checkpoints example by example.
"""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0% and 100%, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test of two models on the same examples: the chance, were both equally good, that
    the examples one solves and the other fails split at least this unevenly (ties, solved or failed by both,
    carry no information and are left out)."""
    changed = gained + lost
    tail = sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2 ** changed
    return min(1.0, 2 * tail)

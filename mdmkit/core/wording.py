"""Counts in the lines a run prints: one noun agreeing with its number, and sizes at one precision whatever their
unit (`0.2M parameters, 0.23M trained` read as two different precisions of one count)."""

from __future__ import annotations

_UNITS = ((1e9, "B"), (1e6, "M"), (1e3, "K"))


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`count noun`, the noun plural unless the count is one: "1 pair", "1,024 pairs"."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def size(count: float) -> str:
    """A count to three significant figures with its unit: 231K, 21.0M, 8.03B (below a thousand: as it is)."""
    rounded = float(f"{count:.3g}")  # 999,600 is 1.00M, not 1000K
    for scale, unit in _UNITS:
        if abs(rounded) >= scale:
            value = rounded / scale
            return f"{value:.{max(0, 3 - len(str(int(abs(value)))))}f}{unit}"
    return f"{count:g}"

"""The tensor names the mixture-of-experts kinds share: per-expert gate, up and down projections."""

from __future__ import annotations

from mdmkit.models.llm.hub_format import Slot

_PROJECTIONS = ("gate", "up", "down")


def experts(prefix: str, own: str, experts: int) -> dict[str, Slot]:
    return {f"{prefix}experts.{e}.{p}_proj.weight": Slot(f"{own}.{p}", e) for e in range(experts) for p in _PROJECTIONS}


def mlp(prefix: str, own: str) -> dict[str, str]:
    return {f"{prefix}{p}_proj.weight": f"{own}.{p}.weight" for p in _PROJECTIONS}

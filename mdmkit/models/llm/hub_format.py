"""The pieces every hub checkpoint reader is made of: typed config.json reads, and tensor-name maps.

A model kind's module (`kinds/`) describes its hub format with these: a function from its config.json to
`DiffusionLMConfig` fields that refuses, in one line, any setting mdmkit's network does not implement (so a
checkpoint never loads into different arithmetic), and a map from its tensor names to the network's parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig

_REQUIRED = object()


class ConfigFields:
    """Typed reads of one config.json, each failure a one-line CheckpointError naming the file and field."""

    def __init__(self, raw: dict[str, Any], source: Path) -> None:
        self.raw, self.source = raw, source

    def get(self, name: str, default: Any = _REQUIRED, kind: type = int) -> Any:
        value = self.raw.get(name)
        if value is None:
            if default is _REQUIRED:
                raise CheckpointError(f"{self.source}: config field '{name}' is missing")
            return default
        if kind is bool and not isinstance(value, bool):
            raise CheckpointError(f"{self.source}: config field {name}={value!r} is not a boolean")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise CheckpointError(f"{self.source}: config field {name}={value!r} is not a {kind.__name__}") from None

    def refuse(self, name: str, supported: Any, default: Any) -> None:
        """Refuse a value of `name` other than `supported` (`default` when the field is absent)."""
        value = self.raw.get(name, default)
        if value != supported:
            raise CheckpointError(f"{self.source}: {name}={value!r} is not supported by mdmkit's network "
                                  f"(only {supported!r})")

    def claims(self, name: str, runs: Any, default: Any) -> None:
        """Refuse a config that says `name` differs from what the official code `runs` (it never reads the field)."""
        value = self.raw.get(name, default)
        if value is not None and value != runs:
            raise CheckpointError(f"{self.source}: {name}={value!r}, but the model's code always runs {runs!r} "
                                  f"(it never reads this field): refusing a checkpoint whose config says otherwise")

    def plain_rope(self) -> None:
        """Refuse a `rope_scaling` other than none or the default."""
        scaling = self.raw.get("rope_scaling")
        if not (scaling is None or isinstance(scaling, dict)
                and scaling.get("rope_type", scaling.get("type")) == "default"):
            raise CheckpointError(f"{self.source}: rope_scaling={scaling!r} is not supported by mdmkit's network "
                                  "(only null)")

    def rotary_dim(self, head_dim: int, default: float | None) -> int | None:
        """The rotated dims of a partial rotary (None: the whole head); `default` None: the field is required."""
        name = "partial_rotary_factor"
        factor = self.get(name, kind=float) if default is None else self.get(name, default, float)
        if not 0.0 < factor <= 1.0:
            raise CheckpointError(f"{self.source}: partial_rotary_factor={factor} must lie in (0, 1]")
        dims = int(head_dim * factor)
        return None if dims == head_dim else dims


class Slot(NamedTuple):
    """Where a hub tensor goes: parameter `name`, at `expert` of its first axis (one expert of the stacked
    [experts, out, in] parameter) and/or its rows [start, stop) (a fused q, k, v); None: the whole."""

    name: str
    expert: int | None = None
    rows: tuple[int, int] | None = None


Target: TypeAlias = "str | Slot | list[Slot]"
TensorNames: TypeAlias = "dict[str, Target]"


@dataclass(frozen=True)
class Architecture:
    """One hub format: its config.json reader, its tensor names (hub name -> parameter, or the slots it fills;
    without the output layer when it is tied) and the output layer's hub name (a tied one may be stored anyway)."""

    read: Callable[[ConfigFields], dict[str, Any]]
    names: Callable[[DiffusionLMConfig], TensorNames]
    head: str


def layered_names(top: Mapping[str, str], block: str, parts: Mapping[str, str],
                  qkv: tuple[str, str, str]) -> Callable[[DiffusionLMConfig], TensorNames]:
    """The tensor names of a dense network: `top` (outside the blocks; the output layer is "head.weight"), each
    block's `parts` under the hub prefix `block` ("...{i}."), and the q, k, v biases under `qkv` when it has them."""

    def names(config: DiffusionLMConfig) -> TensorNames:
        mapped: TensorNames = {hub: own for hub, own in top.items()
                               if not (config.tie_embeddings and own == "head.weight")}
        inside = dict(parts)
        if config.qkv_bias:
            inside.update({f"{hub}.bias": f"attn.{own}.bias" for hub, own in zip(qkv, "qkv")})
        for i in range(config.n_layers):
            mapped.update({block.format(i=i) + hub: f"blocks.{i}.{own}" for hub, own in inside.items()})
        return mapped

    return names

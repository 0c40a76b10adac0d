"""Settings dataclasses as Hydra schemas, so that their defaults are stated once: in the dataclass.

A YAML option puts a schema first in its defaults list and states only what differs from it:

    defaults:
      - /schema/mdmkit.samplers.EBSampler@_here_
      - _self_
    gamma: 0.5

The composed config holds every field as before (with `_target_`), so `sampler.gamma=2` is accepted, `--cfg job`
lists every field, sweeps grid over them, and a typo such as `sampler.gama=2` is refused by Hydra. A field whose
default is itself a settings object (a block sampler's `rule`, NI's `base`) is left out of the schema: the option
chooses it in its defaults list (`- /sampler@rule: threshold`), so that another choice replaces it whole.
mdmkit's config package (`mdmkit.conf`, read from `conf/`) registers the schemas when Hydra imports it.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from hydra.core.config_store import ConfigStore

from mdmkit.core.config import Validated

GROUP = "schema"


def defaults(cls: type) -> dict[str, Any]:
    """Every init field of the dataclass `cls` that has a default, at that default as YAML would state it (tuples
    as lists). Left out: fields without one (the code that builds the object supplies them, as a task does a
    network's vocabulary, or the option states `???` for the user to give) and fields whose default is a settings
    object (its option chooses them)."""
    node: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            continue
        node[field.name] = list(value) if isinstance(value, tuple) else value
    return node


def register(name: str, cls: type) -> None:
    """Store the defaults of `cls` as the config `schema/<name>`."""
    ConfigStore.instance().store(group=GROUP, name=name, node=defaults(cls))


def register_settings(module: ModuleType) -> None:
    """Store every settings dataclass (a `Validated` one whose defaults YAML can state) that `module` exports
    (its `__all__`, else what it defines) as `schema/<module>.<Class>`: its defaults, with the `_target_` an
    option instantiates it by."""
    exported = getattr(module, "__all__", None)
    if exported is None:
        exported = [name for name, value in vars(module).items()
                    if getattr(value, "__module__", None) == module.__name__]
    for name in exported:
        cls = getattr(module, name)
        if not (isinstance(cls, type) and issubclass(cls, Validated) and dataclasses.is_dataclass(cls)):
            continue
        node = defaults(cls)
        if all(_plain(value) for value in node.values()):
            target = f"{module.__name__}.{name}"
            ConfigStore.instance().store(group=GROUP, name=target, node={"_target_": target, **node})


def _plain(value: Any) -> bool:
    """Whether YAML can state `value`: a scalar, or a list or mapping of plain values."""
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return value is None or isinstance(value, (bool, int, float, str))

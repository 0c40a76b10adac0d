"""Settings dataclasses as Hydra schemas, so that their defaults are stated once: in the dataclass.

`register` stores a dataclass's defaults in Hydra's ConfigStore as the config `schema/<name>`; a YAML file puts it
in its defaults list (`- schema/data@data`, `- schema/run@_here_`) and states only what differs. The composed
config holds every field as before, so `data.workers=2` is accepted, `--cfg job` lists it, and a typo such as
`data.wokers=2` is refused by Hydra. mdmkit's config package (`mdmkit.conf`, read from `conf/`) registers its
schemas when Hydra imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

GROUP = "schema"


def defaults(cls: type) -> dict[str, Any]:
    """Every init field of the dataclass `cls` at its default, as YAML would state it (tuples as lists); a field
    without one is `???`, which Hydra refuses to run with until it is given."""
    node: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = MISSING
        node[field.name] = list(value) if isinstance(value, tuple) else value
    return node


def register(name: str, cls: type) -> None:
    """Store the defaults of `cls` as the config `schema/<name>`."""
    ConfigStore.instance().store(group=GROUP, name=name, node=defaults(cls))

"""Typed, validated configs and the one place where Hydra nodes become objects.

Every buildable thing (model spec, objective, task, sampler) is a dataclass that derives from
`Validated`: its fields are type-checked against their annotations and its `validate` hook checks
ranges, so a wrong key or value stops at start-up with one line that names it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mdmkit.core.errors import ConfigError


def require(condition: bool, message: str) -> None:
    """Raise `ConfigError(message)` unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


_DURATION = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")  # "DD:HH:MM:SS", as Lightning reads trainer.max_time


def duration_seconds(text: Any) -> float | None:
    """Seconds in a "DD:HH:MM:SS" duration (Lightning's `max_time` string); None if it is not one."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    days, hours, minutes, seconds = (int(part) for part in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def require_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    """A top-level setting (no dataclass types it) that must be an integer >= `minimum` (or null if `optional`)."""
    if optional and value is None:
        return
    require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
            f"{name}={value} must be an integer >= {minimum}" + (" or null" if optional else ""))


def require_bool(name: str, value: Any) -> None:
    require(isinstance(value, bool), f"{name}={value} must be true or false")


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (tuple, list):
        args = typing.get_args(annotation)
        if not isinstance(value, (tuple, list)):
            return False
        if args and (origin is list or args[-1] is Ellipsis):  # list[X], tuple[X, ...]: any length, every item an X
            return all(_matches(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(map(_matches, value, args)))
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _admits(annotation: Any, test: Callable[[Any], bool]) -> bool:
    """Whether `annotation`, or for a union any of its members, passes `test`."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return any(_admits(arg, test) for arg in typing.get_args(annotation))
    return test(annotation)


def _describe(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


@dataclasses.dataclass
class Validated:
    """Dataclass base that type-checks its fields and runs `validate()` after construction."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value, hint = getattr(self, field.name), hints[field.name]
            if isinstance(value, list) and _admits(hint, lambda a: typing.get_origin(a) is tuple):  # YAML has no tuples
                value = tuple(value)
                object.__setattr__(self, field.name, value)
            require(_matches(value, hint), f"{field.name}={value!r}: expected {_describe(hint)}")
        self.validate()

    def validate(self) -> None:
        """Range checks beyond types; override and call `require`."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_UNEXPECTED_KWARG = re.compile(r"unexpected keyword argument '(\w+)'")


def _target_keys(node: DictConfig) -> list[str]:
    try:
        parameters = inspect.signature(_located(node["_target_"])).parameters
    except Exception:  # noqa: BLE001 -- best effort: an unlocatable target (None here) simply lists no keys
        return []
    return [p for p in parameters if p not in ("self", "args", "kwargs")]


def build(node: DictConfig | dict, where: str, **kwargs: Any) -> Any:
    """Instantiate a `_target_` node; any failure becomes one `ConfigError` naming the config group."""
    if not isinstance(node, DictConfig):
        node = OmegaConf.create(node)
    require("_target_" in node, f"{where}: config has no _target_")
    require_given(node, where)
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause = error.__cause__ or error
        if isinstance(cause, ConfigError):
            raise ConfigError(f"{where}: {cause}") from None
        match = _UNEXPECTED_KWARG.search(str(cause))
        if match:
            valid = ", ".join(k for k in _target_keys(node) if k not in kwargs)
            raise ConfigError(f"{where}: unknown key '{match.group(1)}' (valid keys: {valid})") from None
        raise ConfigError(f"{where}: cannot build {node['_target_']}: {cause}") from None


def require_given(node: DictConfig | dict, where: str = "") -> None:
    """Every `???` of `node` given a value, else one line naming its full key (`sft.model`, not omegaconf's
    `model`) and how to give it. `where`: the node's own key in the run's config ("" at the top)."""
    raw = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
    keys = [f"{where}.{key}" if where else key for key in _missing(raw)]
    if keys:
        raise ConfigError(f"{keys[0]} has no value (??? in its config): give it on the command line, "
                          f"{keys[0]}=..." + (f" (also missing: {', '.join(keys[1:])})" if keys[1:] else ""))


def _missing(value: Any, key: str = "") -> list[str]:
    """The full keys of a plain container's `???` values."""
    if isinstance(value, dict):
        return [found for name, item in value.items() for found in _missing(item, f"{key}.{name}" if key else name)]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _missing(item, f"{key}[{i}]")]
    return [key] if value == "???" else []


def to_container(node: DictConfig | dict, resolve: bool = True) -> dict[str, Any]:
    """A plain dict, fully resolved unless `resolve` is False (what results files and checkpoints store)."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=resolve)  # type: ignore[return-value]  # a dict, keyed by str here
    return dict(node)


def _located(target: Any) -> Any:
    try:
        from hydra._internal.utils import _locate

        return _locate(target) if isinstance(target, str) else None
    except Exception:  # noqa: BLE001 -- an unlocatable target is left as written
        return None


def _typed(value: Any, annotation: Any) -> Any:
    """An integer given where the field takes a float (and not an int) as that float: `gamma=1` is `gamma=1.0`."""
    if isinstance(value, int) and not isinstance(value, bool) and _matches(0.5, annotation) \
            and not _admits(annotation, lambda a: a is int or a is Any):
        return float(value)
    return value


def identity(node: Any) -> Any:
    """What determines a `_target_` node (nested nodes alike): its fields as its dataclass types them, without the
    ones at their defaults. Equal settings written differently (`gamma=1` / `1.0`, a default stated or left out,
    a field added later with the old behaviour as its default) have one identity, which results keys hash."""
    if isinstance(node, list | tuple):
        return [identity(value) for value in node]
    if not isinstance(node, dict):
        return node
    cls = _located(node.get("_target_"))
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else {}
    hints = typing.get_type_hints(cls) if fields else {}
    kept = {}
    for name, value in node.items():
        value = identity(value)
        field = fields.get(name)
        if field is not None:
            value = _typed(value, hints[name])
            default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
            if default is not dataclasses.MISSING and _same(value, default):
                continue
        kept[name] = value
    return kept


def _same(value: Any, default: Any) -> bool:
    """Equal and of one type (`0` is not `False`); a YAML list equals a tuple default."""
    if isinstance(default, tuple):
        default = list(default)
    return type(value) is type(default) and value == default


def option(group: str, name: str) -> dict[str, Any]:
    """Option `name` of config group `group` as `group=name` selects it: composed by Hydra, so the shared fields
    an option inherits through its defaults list are included.

    Inside a running Hydra app its search path (and so a user's own config groups) applies; elsewhere the
    packaged configs do.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    def composed() -> dict[str, Any]:
        try:
            return to_container(compose(overrides=[f"+{group}={name}"])[group])
        except MissingConfigException:
            known = GlobalHydra.instance().config_loader().get_group_options(group)
            raise ConfigError(f"{group}={name}: no such option (known: {', '.join(known)})") from None

    if GlobalHydra.instance().is_initialized():
        return composed()
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        return composed()

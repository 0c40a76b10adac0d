"""One source of truth for defaults: every settings object a config builds (run, data, hf, samplers, networks,
tasks, objectives, the optimizer, fine-tuning, trajectories) takes its defaults from its dataclass, registered as
a Hydra schema (mdmkit/core/schema.py); the YAML options state only what differs (presets and overrides).

Composed, an option still holds every field of its class: Hydra accepts `sampler.<field>=...` only for keys the
config has and sweeps grid only over them. Results rows are keyed by the sampler's identity (its fields without
the ones at their defaults, mdmkit.core.config.identity), so stored rows keep their keys however an option is
written.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from hydra.utils import get_class, get_object
from omegaconf import OmegaConf

from mdmkit.core.config import option
from mdmkit.core.schema import defaults

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Groups whose options build a settings object (the others configure Hydra, Lightning or sweeps).
GROUPS = ("sampler", "block_rule", "model", "task", "objective", "optim", "indicator", "sft", "trajectories", "rl",
          "rl_estimator", "rl_loss", "reward")
# Results-neutral machine settings: the CLI sizes them for the 2-core default machine, Python stays serial.
MACHINE_SETTINGS = ("workers",)
OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((CONF / group).glob("*.yaml"))]


def dataclass_nodes(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every `_target_` node of a config tree that names a dataclass, with where it sits."""
    if not isinstance(node, dict):
        return
    target = get_object(node["_target_"]) if "_target_" in node else None  # a class, or a function to call
    if isinstance(target, type) and dataclasses.is_dataclass(target):
        yield where, node
    for key, value in node.items():
        yield from dataclass_nodes(value, f"{where}.{key}")


def class_defaults(cls: type) -> dict[str, Any]:
    """The init fields of `cls` that have a default (required fields are left out)."""
    found = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
    return found


def stated_differences(node: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """The fields a composed `node` holds with another value than the defaults `found` (nested settings compared
    field by field with the default object). Computed values (`${...}` interpolations), required ones (`???`) and
    machine settings are no defaults and are skipped."""
    differences = {}
    for key, value in node.items():
        if key in ("_target_", *MACHINE_SETTINGS) or key not in found:
            continue
        if isinstance(value, str) and ("${" in value or value == "???"):
            continue
        default = found[key]
        if isinstance(value, dict) and "_target_" in value:
            if type(default) is not get_class(value["_target_"]):
                differences[key] = (value["_target_"], type(default).__name__)
            else:
                nested = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
                differences.update({f"{key}.{k}": v for k, v in stated_differences(value, nested).items()})
        elif value != (list(default) if isinstance(default, tuple) else default):
            differences[key] = (value, default)
    return differences


def raw(group: str, name: str) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"), resolve=False)


def inherited(group: str, name: str) -> dict[str, Any]:
    """What an option's defaults list gives it before its own lines (`_self_`): schemas, options it extends,
    settings it chooses for a field (`/sampler@rule: threshold`)."""
    result: dict[str, Any] = {}
    for entry in raw(group, name).get("defaults", []):
        if entry == "_self_":
            break
        (path, choice), = entry.items() if isinstance(entry, dict) else [(entry, None)]
        path, _, package = path.partition("@")
        path = path[1:] if path.startswith("/") else f"{group}/{path}"  # relative: an option of the same group
        if path.startswith("schema/"):
            target = path.removeprefix("schema/")
            node = {"_target_": target, **defaults(get_object(target))}
        elif choice is None:  # another option of a group, e.g. /sampler/steps
            node = option(*path.split("/"))
        else:
            node = {package: option(path, choice)}
        result.update(node if package in ("_here_", "") or choice is not None else {package: node})
    return result


def restated(own: dict[str, Any], base: dict[str, Any], where: str = "") -> list[str]:
    """The keys of `own` whose value is the one `base` already has."""
    found = []
    for key, value in own.items():
        if key == "defaults" or key not in base:
            continue
        if isinstance(value, dict) and isinstance(base[key], dict):
            found += restated(value, base[key], f"{where}{key}.")
        elif value == base[key]:
            found.append(f"{where}{key}")
    return found


@pytest.mark.parametrize(("group", "name"), OPTIONS, ids=[f"{g}/{n}" for g, n in OPTIONS])
def test_an_option_states_only_what_differs_from_its_schema(group: str, name: str) -> None:
    own = raw(group, name)
    assert not list(dataclass_nodes(own, name)), "a settings class comes from its schema (`/schema/<target>@...`)"
    assert not restated(own, inherited(group, name)), "restated defaults: the dataclass is their one source"


@pytest.mark.parametrize(("group", "name"), OPTIONS, ids=[f"{g}/{n}" for g, n in OPTIONS])
def test_a_composed_option_holds_every_field_of_its_class(group: str, name: str) -> None:
    """Every field with a default is on the command line (`sampler.gamma=...`); fields without one are supplied by
    the code (a network's vocabulary) or stated `???` for the user."""
    nodes = list(dataclass_nodes(option(group, name), name))
    assert nodes
    for where, node in nodes:
        cls = get_class(node["_target_"])
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        assert set(class_defaults(cls)) <= set(node) - {"_target_"} <= fields, where


def test_every_configured_dataclass_has_an_option_at_its_defaults() -> None:
    """`Class()` in Python and its plain option on the command line are the same object; presets (other options of
    the same class) differ on purpose."""
    differences: dict[type, dict[str, dict[str, Any]]] = defaultdict(dict)
    for group, name in OPTIONS:
        for where, node in dataclass_nodes(option(group, name), f"{group}/{name}"):
            cls = get_class(node["_target_"])
            differences[cls][where] = stated_differences(node, class_defaults(cls))
    assert len(differences) > 20  # samplers, models, tasks, objectives, optimizer, indicator, trajectories
    no_plain_option = {cls.__name__: options for cls, options in differences.items() if all(options.values())}
    assert not no_plain_option, f"no option of these classes is at their defaults: {no_plain_option}"


def composed(config_name: str, overrides: list[str]) -> dict[str, Any]:
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        return OmegaConf.to_container(compose(config_name, overrides), resolve=False)


def test_the_run_data_and_hf_settings_have_their_defaults_from_the_dataclasses_only() -> None:
    """train.yaml's run settings and `data`, and evaluate.yaml's `hf`: the composed configs hold every field at
    its default, the YAML states none."""
    from mdmkit.evaluation.hf_config import HFModelConfig
    from mdmkit.training.run_config import DataConfig, RunConfig

    train, evaluate = composed("train", ["~experiment"]), composed("evaluate", [])  # no experiment's settings
    assert train["data"] == class_defaults(DataConfig)
    run_defaults = class_defaults(RunConfig)
    assert {name: train[name] for name in run_defaults} == run_defaults
    assert evaluate["hf"] == class_defaults(HFModelConfig)
    train_yaml = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"), resolve=False)
    evaluate_yaml = OmegaConf.to_container(OmegaConf.load(CONF / "evaluate.yaml"), resolve=False)
    assert not set(train_yaml) & {"data", *run_defaults}
    assert "hf" not in evaluate_yaml


def test_a_misspelt_field_is_refused_and_a_schema_field_is_accepted() -> None:
    """The schema's fields are the config's keys: `sampler.gamma` needs no `+`, a typo is refused by Hydra."""
    from hydra.errors import ConfigCompositionException

    assert composed("evaluate", ["sampler=eb", "sampler.gamma=0.5"])["sampler"]["gamma"] == 0.5
    assert composed("evaluate", ["task=gsm8k", "task.limit=5"])["task"]["limit"] == 5  # a field no YAML states
    with pytest.raises(ConfigCompositionException, match="gama"):
        composed("evaluate", ["sampler=eb", "sampler.gama=0.5"])

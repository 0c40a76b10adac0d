"""One source of truth for defaults: the run, data and hf settings come from their dataclasses alone (schemas the
YAML extends); every other YAML option agrees with the dataclass it builds.

Sampler options, as composed (the fields every masked-loop sampler shares come from
`conf/sampler_fields/masked_loop.yaml`), state every field of their class: Hydra accepts `sampler.<field>=...`
only for keys the option has, sweeps grid only over them, and results rows are keyed by the composed dict, so
the stored rows of docs/results must come back unchanged from today's options.
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

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SAMPLER_OPTIONS = sorted((CONF / "sampler").glob("*.yaml"))
# Results-neutral machine settings: the CLI sizes them for the 2-core default machine, Python stays serial.
MACHINE_SETTINGS = {"workers"}


def dataclass_nodes(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every `_target_` node of a raw config tree that names a dataclass, with where it sits."""
    if not isinstance(node, dict):
        return
    target = get_object(node["_target_"]) if "_target_" in node else None  # a class, or a function to call
    if isinstance(target, type) and dataclasses.is_dataclass(target):
        yield where, node
    for key, value in node.items():
        yield from dataclass_nodes(value, f"{where}.{key}")


def raw_config(path: Path) -> dict[str, Any]:
    """A config file's content; a sampler option as `sampler=<name>` selects it (with what it inherits)."""
    if path.parent == CONF / "sampler":
        return option("sampler", path.stem)
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def class_defaults(cls: type) -> dict[str, Any]:
    """The fields of `cls` that have a default (required fields are left out)."""
    defaults = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def stated_differences(node: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The fields `node` states with another value than `defaults` (nested objects compared field by field).

    Computed values (`${...}` interpolations) and required ones (`???`) are no defaults and are skipped.
    """
    differences = {}
    for key, value in node.items():
        if key == "_target_" or key in MACHINE_SETTINGS or key not in defaults:
            continue
        if isinstance(value, str) and ("${" in value or value == "???"):
            continue
        default = defaults[key]
        if isinstance(value, dict) and "_target_" in value:
            if type(default) is not get_class(value["_target_"]):
                differences[key] = (value["_target_"], type(default).__name__)
                continue
            nested = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
            differences.update({f"{key}.{k}": v for k, v in stated_differences(value, nested).items()})
        elif value != (list(default) if isinstance(default, tuple) else default):
            differences[key] = (value, default)
    return differences


def test_every_configured_dataclass_has_an_option_stating_its_defaults() -> None:
    """`Class()` in Python and its plain option on the command line are the same object; presets (other
    options of the same class) differ on purpose."""
    differences: dict[type, dict[str, dict[str, Any]]] = defaultdict(dict)
    for path in sorted(CONF.rglob("*.yaml")):
        for where, node in dataclass_nodes(raw_config(path), str(path.relative_to(CONF))):
            cls = get_class(node["_target_"])
            differences[cls][where] = stated_differences(node, class_defaults(cls))
    assert len(differences) > 20  # samplers, models, tasks, objectives, optimizer, indicator, trajectories
    no_plain_option = {cls.__name__: options for cls, options in differences.items()
                       if all(options.values())}
    assert not no_plain_option, f"YAML values that disagree with the dataclass defaults: {no_plain_option}"


@pytest.mark.parametrize("path", SAMPLER_OPTIONS, ids=lambda p: p.stem)
def test_every_sampler_option_states_every_field_of_its_class(path: Path) -> None:
    for where, node in dataclass_nodes(raw_config(path), path.stem):
        fields = {f.name for f in dataclasses.fields(get_class(node["_target_"]))}
        assert set(node) - {"_target_"} == fields, where


def composed(config_name: str, overrides: list[str]) -> dict[str, Any]:
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        return OmegaConf.to_container(compose(config_name, overrides), resolve=False)


def test_the_run_data_and_hf_settings_have_their_defaults_from_the_dataclasses_only() -> None:
    """train.yaml's run settings and `data`, and evaluate.yaml's `hf`, come from their dataclasses (registered
    schemas, mdmkit/core/schema.py): the composed configs hold every field at its default, the YAML states none."""
    from mdmkit.evaluation.hf_config import HFModelConfig
    from mdmkit.training.run_config import DataConfig, RunConfig

    train, evaluate = composed("train", ["~experiment"]), composed("evaluate", [])  # no experiment's settings
    assert train["data"] == class_defaults(DataConfig)
    run_defaults = class_defaults(RunConfig)
    assert {name: train[name] for name in run_defaults} == run_defaults
    assert evaluate["hf"] == class_defaults(HFModelConfig)
    train_yaml, evaluate_yaml = raw_config(CONF / "train.yaml"), raw_config(CONF / "evaluate.yaml")
    assert not set(train_yaml) & {"data", *run_defaults}
    assert "hf" not in evaluate_yaml

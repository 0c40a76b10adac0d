"""Checks of a command line's overrides that Hydra does not make, or makes with a less helpful message.

Each names the override at fault and what would be right, in one line (`ConfigError`), before a run starts.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from mdmkit.core.errors import ConfigError
from mdmkit.training.resume import parse_overrides

_NOT_A_KEY = re.compile(r"Could not override '([\w.]+)'")  # Hydra's refusal of a key its node does not have


def _given(argv: list[str]) -> list[Any]:
    """The overrides among a command line's arguments (not its flags), parsed."""
    return parse_overrides([arg for arg in argv if "=" in arg and not arg.startswith("-")])


def task_fields(overrides: list[str]) -> set[str]:
    """The task fields a command line sets by name (`task.answer=path`, `~task.test_file`), not through `task=`."""
    return {o.key_or_group.split(".")[1] for o in parse_overrides(overrides) if o.key_or_group.startswith("task.")}


def names_sampler(overrides: list[str]) -> bool:
    """Whether a command line picks a sampler or sets one of its fields (`sampler=eb`, `sampler.k=2`,
    `sampler@sampler.rule=topk`): where none does, a text task takes its model kind's own default sampler."""
    return any(o.key_or_group.lstrip("+~").split("@")[0].split(".")[0] == "sampler" for o in parse_overrides(overrides))


def check_task_named(argv: list[str]) -> None:
    """`task.FIELD=...` needs `task=NAME` beside it: evaluate.py has no task until one is named (the checkpoint's
    own otherwise), and Hydra's own refusal suggests `+task.FIELD`, which builds no task at all."""
    overrides = _given(argv)
    fields = [o.input_line for o in overrides if o.key_or_group.startswith("task.")]
    if fields and all(o.key_or_group != "task" for o in overrides):
        raise ConfigError(f"{fields[0]} changes a task, but no task=NAME is given: name the checkpoint's task first, "
                          f"e.g. task=sudoku {fields[0].lstrip('+')} (fields not named keep their trained values)")


def check_sweep_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """`sweep=` takes every sampler and its oracle flag from the sweep's grid: refuse `sampler...` and `oracle=`
    given beside it, which would be ignored (every row found done, or made with the grid's settings)."""
    if not cfg.get("sweep"):
        return
    ignored = [o.input_line for o in OverridesParser.create().parse_overrides(overrides)
               if o.key_or_group.split(".")[0] in ("sampler", "oracle") and o.input_line is not None]
    if ignored:
        raise ConfigError(f"sweep={cfg.sweep.get('name', '...')} sets the samplers and oracle of each row; "
                          f"{' '.join(ignored)} would be ignored: drop it, or add it to the sweep's grid")


def check_known_keys(config_name: str, argv: list[str]) -> None:
    """An override of a key its node does not have (`sampler.gama=0.1`) is refused naming the close key and the
    valid ones, where Hydra would suggest appending it (`+sampler.gama`). Composes mdmkit's own configs (user
    config groups and other problems are left to Hydra, which reports them in its own words)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    plain = [o.input_line for o in _given(argv) if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        try:
            compose(config_name, overrides=plain)
            return
        except ConfigCompositionException as error:
            unknown = _NOT_A_KEY.match(str(error))
        if unknown is None:
            return
        key = unknown.group(1)
        try:
            composed = compose(config_name, overrides=[o for o in plain if o.split("=")[0] != key])
        except Exception:  # noqa: BLE001 -- best effort: Hydra's own message follows
            return
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(composed, parent) if parent else composed
    valid = sorted(str(k) for k in node) if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    raise ConfigError(f"{key}: {parent or config_name} has no key '{name}' ({hint}valid: {', '.join(valid)})")

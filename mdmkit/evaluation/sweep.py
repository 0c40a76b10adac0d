"""Grid sweeps in one process: a list of sampler configs, expanded from a compact spec, run on one loaded model.

A sweep config (`conf/sweep/*.yaml`) lists entries; each names a sampler config group option and a grid of
values for its fields. Entries expand to the product of their grid, each a full sampler config that is
validated before anything runs, so a typo in the last entry fails at start-up, not after an hour. Each job keeps
the name of the option it came from (`preset`), so its row, console line and plot label can say `llada` rather
than only the rule it configures (`steps-confidence`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from mdmkit.core.config import build, identity, option, require, to_container
from mdmkit.core.errors import ConfigError
from mdmkit.evaluation.resolve import checkpoint_fields
from mdmkit.io.results import canonical


@dataclass(frozen=True)
class SweepJob:
    sampler: dict[str, Any]  # a full sampler config (with _target_)
    oracle: bool  # also record the oracle floor of this sampler's trajectories
    preset: str | None = None  # the `conf/sampler/<name>.yaml` option the config was made from, where known


def sampler_preset(name: str) -> dict[str, Any]:
    """The sampler option `name` (`conf/sampler/<name>.yaml` with what it inherits) as a dict."""
    try:
        return option("sampler", name)
    except ConfigError as error:
        raise ConfigError(f"sweep: {error}") from None


def expand(sweep: DictConfig | dict[str, Any]) -> list[SweepJob]:
    """Every sampler config of the sweep, in order; each is built once here to validate it."""
    spec = to_container(sweep) if isinstance(sweep, DictConfig) else sweep
    entries = spec.get("entries") or []
    require(isinstance(entries, list) and bool(entries), "sweep: entries must be a non-empty list of "
                                                          "{sampler, grid, oracle} entries")
    jobs: dict[str, SweepJob] = {}  # by identity: a sampler listed twice runs once, under its first option
    for number, entry in enumerate(entries):
        where = f"sweep.entries[{number}]"
        require(isinstance(entry, dict) and "sampler" in entry, f"{where}: each entry needs a sampler: option")
        unknown = set(entry) - {"sampler", "grid", "oracle"}
        require(not unknown, f"{where}: unknown key(s) {sorted(unknown)} (valid: sampler, grid, oracle)")
        require(isinstance(entry.get("oracle", False), bool), f"{where}: oracle={entry.get('oracle')!r} must be "
                                                               "true or false")
        base = sampler_preset(entry["sampler"])
        grid = entry.get("grid") or {}
        for field in grid:
            require(field in base, f"{where}: sampler '{entry['sampler']}' has no field '{field}'")
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        require(all(values), f"{where}: an empty list in grid leaves no sampler to run")
        for combination in itertools.product(*values):
            config = {**base, **dict(zip(grid, combination))}
            build(config, where, **{name: None for name in checkpoint_fields(config)})  # paths: checked, not loaded
            key = canonical(identity(config))
            oracle = bool(entry.get("oracle", False)) or (key in jobs and jobs[key].oracle)
            preset = jobs[key].preset if key in jobs else str(entry["sampler"])
            jobs[key] = SweepJob(config, oracle, preset)
    return list(jobs.values())

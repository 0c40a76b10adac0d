"""How runs are named: one place for the family a row is drawn under and the label a run is shown with.

Console lines, results rows, wandb tables, Pareto tables and plots all name a run through this module, so a name
read in one is the name found in the others. A family is the sampler's rule ("eb-confidence"), qualified by the
`conf/sampler` option that configured it when that option says more than the rule ("llada (steps-confidence)");
a label adds the settings that tell runs of one family apart ("eb-confidence gamma=0.001"). Stored rows carry
their family, so these names are part of the results files: they must not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from mdmkit.io.results import canonical

ORACLE = "oracle"
# Fields the family name already says (ordering and P2's score, the KV cache) or that name the class.
_IN_FAMILY = ("_target_", "name", "ordering", "score", "cache")


@cache
def _masked_loop_defaults() -> dict[str, Any]:
    """The fields every masked-loop sampler shares, at the values that change nothing: left out of labels (a
    temperature of 0.7 is shown, one of 0.0 is not)."""
    from mdmkit.samplers import MaskedSampler

    return {field.name: field.default for field in dataclasses.fields(MaskedSampler)}


# ------------------------------------------------------------------------------------- a sampler config's names


def sampler_family(sampler: Mapping[str, Any] | None, kind: str | None = None) -> str:
    """The sampling rule of a sampler config: the class name without "Sampler"/"Decoder", lower case, then the
    ordering (P2: its score) and a KV cache other than none.

    `{"_target_": "mdmkit.samplers.EBSampler", "ordering": "entropy"}` -> "eb-entropy"; an NI sampler over EB ->
    "ni-eb-confidence"; EB with the dual cache -> "eb-confidence+dual"; an oracle floor ("oracle" kind or sampler
    name) -> "oracle".
    """
    sampler = sampler or {}
    if kind == ORACLE or sampler.get("name") == ORACLE:
        return ORACLE
    target = sampler.get("_target_")
    if target:
        name = str(target).rsplit(".", 1)[-1].removesuffix("Sampler").removesuffix("Decoder").lower()
    else:
        name = str(sampler.get("name", "unknown")).lower()
    for inner in ("rule", "base"):  # a decoder that delegates reveals to a sampler (SBD), a sampler on another (NI)
        if isinstance(sampler.get(inner), Mapping):
            return f"{name}-{sampler_family(sampler[inner])}"
    ordering = sampler.get("ordering", sampler.get("score"))
    family = f"{name}-{ordering}" if isinstance(ordering, str) and ordering else name
    cache = sampler.get("cache")
    return f"{family}+{cache}" if isinstance(cache, str) and cache not in ("", "none") else family


def _normalised(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def is_plain_preset(preset: str, family: str) -> bool:
    """Whether the option `preset` is the rule's own option, which the family name already says: "eb" for
    "eb-confidence", "ni_eb" for "ni-eb-confidence", "dream_steps" for "dreamsteps-entropy", "all" for
    "revealall-confidence"; not "llada" (a steps schedule), "fastdllm_threshold" or "dream_entropy"."""
    name = _normalised(preset)
    parts = family.split("+")[0].split("-")
    prefixes = {_normalised("".join(parts[:i])) for i in range(1, len(parts) + 1)}
    return name in prefixes or (len(name) >= 3 and _normalised(parts[0]).endswith(name))


def preset_family(family: str, preset: str | None) -> str:
    """The family a row is drawn and tabled under: `family` itself for rows without a preset (a config composed
    outside Hydra) and for the rule's plain option; else the option first: ("steps-confidence", "llada") ->
    "llada (steps-confidence)", so presets with different configs get fronts of their own. Idempotent."""
    if not preset or family == ORACLE or is_plain_preset(preset, family) or f"{preset} (" in family:
        return family
    return f"{preset} ({family})"


def settings_items(sampler: Mapping[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    """The (field, value) pairs of a sampler config that tell runs of one family apart: fields the family name
    says and shared fields at their no-op value are left out; a nested sampler (NI's base, SBD's rule) gives
    "base.k"-style fields; an oracle floor gives those of the sampler it is the floor of."""
    if not sampler:
        return []
    if sampler.get("name") == ORACLE:
        return settings_items(sampler.get("reference") or {}, prefix)
    items: list[tuple[str, Any]] = []
    shared = _masked_loop_defaults()
    for key, value in sampler.items():
        if key in _IN_FAMILY or value is None or (key in shared and value == shared[key]):
            continue
        if isinstance(value, Mapping):
            items += settings_items(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def sampler_settings(sampler: Mapping[str, Any] | None) -> str:
    """`settings_items` as "key=value, ...": "gamma=0.001", "epsilon=0.9, base.k=1". An oracle floor:
    "floor of <family> <settings>"."""
    if sampler and sampler.get("name") == ORACLE:
        inner = sampler.get("reference") or {}
        return f"floor of {sampler_family(inner)} {sampler_settings(inner)}".strip()
    return ", ".join(f"{key}={value}" for key, value in settings_items(sampler))


def run_label(family: str, sampler: Mapping[str, Any] | None, preset: str | None = None) -> str:
    """How one run is named on a console line or in a plot: "eb-confidence gamma=0.001", "llada (steps-confidence)
    steps=64, block_length=32"; an oracle floor: "oracle floor of topk-confidence k=1"."""
    sampler = sampler or {}
    if family == ORACLE or sampler.get("name") == ORACLE:
        inner = sampler.get("reference") or {}
        return f"oracle floor of {run_label(sampler_family(inner), inner, preset)}".strip()
    return f"{preset_family(family, preset)} {sampler_settings(sampler)}".strip()


# ------------------------------------------------------------------------------------------- a row's names


def derive_family(row: Mapping[str, Any]) -> str:
    """The family a row's front is drawn under: its `family` (else `sampler_family` of its sampler config),
    qualified by its `preset` (`preset_family`): "eb-entropy", "llada (steps-confidence)", "oracle"."""
    family = str(row.get("family") or sampler_family(row.get("sampler"), row.get("kind")))
    preset = row.get("preset")
    return preset_family(family, preset if isinstance(preset, str) else None)


def row_label(row: Mapping[str, Any]) -> str:
    """One run, named as console lines and plots name it: its family (with its preset) and settings, e.g.
    "eb-confidence gamma=0.001" or "llada (steps-confidence) steps=64, block_length=32"."""
    preset = row.get("preset")
    family = derive_family(row)
    if family != ORACLE and row.get("kind") != ORACLE:  # the family may be tagged ("mdm: eb-confidence")
        return f"{family} {sampler_settings(row.get('sampler'))}".strip()
    return run_label(ORACLE, row.get("sampler"), preset if isinstance(preset, str) else None)


def row_settings(row: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a row's sampler that tell runs of a family apart, by field (`settings_items`)."""
    return dict(settings_items(row.get("sampler")))


def swept_settings(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The settings whose value differs between `rows` (one family's), in the order the configs list them."""
    rows = list(rows)
    values: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row_settings(row).items():
            values.setdefault(key, set()).add(repr(value))
    return [key for key, seen in values.items()
            if len(seen) > 1 or any(key not in row_settings(row) for row in rows)]


def _ordered(values: Iterable[Any]) -> list[Any]:
    distinct = list({canonical(v): v for v in values}.values())
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numbers else sorted(distinct, key=str)


def family_settings(rows: Iterable[Mapping[str, Any]]) -> str:
    """What a family's runs were run with, in one cell: swept settings with their values, then fixed ones:
    "gamma ∈ {0.001, 0.01, 0.1}; block_length=32"."""
    rows = list(rows)
    swept = swept_settings(rows)
    parts = [f"{key} ∈ {{{', '.join(str(v) for v in _ordered(row_settings(r).get(key) for r in rows))}}}"
             for key in swept]
    fixed = {k: v for k, v in (row_settings(rows[0]) if rows else {}).items() if k not in swept}
    parts += [", ".join(f"{k}={v}" for k, v in fixed.items())] if fixed else []
    return "; ".join(parts)

"""Bring results files written by an older mdmkit to today's row layout, in place (a `.bak` copy kept).

    .venv/bin/python tools/migrate_rows.py docs/results/*.jsonl

A sampler `_target_` named by its module path (`mdmkit.samplers.ni.NISampler`; anywhere in a row, nested ones
too) becomes the path `mdmkit.samplers` exports it under, which module moves never change. LLaDA2.0's rule drops the
masked-loop fields it once inherited at the only values it took (its own config has none; the row's family follows
the config), and one from before `mask_never_drawn` says `true` (its draw left the mask token out; today's default
draws it, as the reference does). A `fast_dllm_v2` preset row from before `attention_block` whose blocks divide 32
says the preset's 32 (the same attention there; larger blocks attended over the whole block, the null it keeps).
Every evaluation row gets
the fields rows carry today (`preset`, `family`); a row that stores what it was measured on (`measurement`) is keyed
again by today's `evaluation_key`, so a resumed sweep recognises it. Rows from before `measurement` was stored keep
their key: it hashes a data fingerprint the row does not hold, so a resume measures such a setting once more. Prints
what changed per file.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import mdmkit.samplers
from mdmkit.io.naming import sampler_family
from mdmkit.io.results import evaluation_key, read_records

EVALUATION_KINDS = ("evaluate", "oracle")
SAMPLERS = "mdmkit.samplers."
LLADA2 = SAMPLERS + "Llada2Sampler"
LLADA2_INHERITED = {"ordering": "confidence", "block_length": None, "cache": "none", "cache_refresh": None,
                    "mask_in_softmax": True}  # the masked-loop fields LLaDA2.0's rule had, at the values it took
FAST_DLLM_V2 = "fast_dllm_v2"  # the preset reproducing Fast-dLLM v2's generate


def public_target(target: str) -> str:
    """`target` as `mdmkit.samplers` exports it: `mdmkit.samplers.p2.P2Sampler` -> `mdmkit.samplers.P2Sampler`
    (any other path unchanged)."""
    name = target.rsplit(".", 1)[-1]
    if target.startswith(SAMPLERS) and target != SAMPLERS + name and name in mdmkit.samplers.__all__:
        return SAMPLERS + name
    return target


def with_public_targets(value: Any) -> Any:
    """`value` with every sampler `_target_` inside it (a wrapper's `base`, a decoder's `rule`) made public."""
    if isinstance(value, dict):
        return {key: public_target(item) if key == "_target_" and isinstance(item, str) else with_public_targets(item)
                for key, item in value.items()}
    if isinstance(value, list):
        return [with_public_targets(item) for item in value]
    return value


def without_inherited_fields(value: Any) -> Any:
    """`value` with every LLaDA2.0 rule config inside it stripped of the masked-loop fields it no longer has."""
    if isinstance(value, dict):
        own = value.get("_target_") == LLADA2
        return {key: without_inherited_fields(item) for key, item in value.items()
                if not (own and key in LLADA2_INHERITED and item == LLADA2_INHERITED[key])}
    if isinstance(value, list):
        return [without_inherited_fields(item) for item in value]
    return value


def with_old_draws(value: Any) -> Any:
    """`value` with every LLaDA2.0 rule config from before `mask_never_drawn` stating that its draw left the mask
    token out."""
    if isinstance(value, dict):
        new = {key: with_old_draws(item) for key, item in value.items()}
        if new.get("_target_") == LLADA2 and "mask_never_drawn" not in new:
            new["mask_never_drawn"] = True
        return new
    if isinstance(value, list):
        return [with_old_draws(item) for item in value]
    return value


def with_preset_attention(row: dict[str, Any]) -> dict[str, Any]:
    """A `fast_dllm_v2` preset row from before `attention_block` with the preset's 32 where its blocks divide 32
    (its sampler and params alike)."""
    sampler = row.get("sampler")
    if row.get("preset") != FAST_DLLM_V2 or not isinstance(sampler, dict) or "attention_block" in sampler \
            or 32 % int(sampler.get("block_size", 32)) != 0:
        return row
    row = {**row, "sampler": {**sampler, "attention_block": 32}}
    if isinstance(row.get("params"), dict):
        row["params"] = {**row["params"], "attention_block": 32}
    return row


def migrated(row: dict[str, Any]) -> dict[str, Any]:
    """The row in today's layout (unchanged where it already is)."""
    public = with_public_targets(row)
    row = with_preset_attention(with_old_draws(without_inherited_fields(public)))
    if row.get("kind") not in EVALUATION_KINDS:
        return row
    row = row if "preset" in row else {"preset": None, **row}
    family = sampler_family(row.get("sampler"), row.get("kind"))
    if row.get("sampler") != public.get("sampler"):  # the sampler's fields changed: its family is made again
        row["family"] = family
    row.setdefault("family", family)
    if isinstance(row.get("measurement"), dict) and isinstance(row.get("sampler"), dict):
        row["key"] = evaluation_key(row["kind"], row["sampler"], row["measurement"])
    return row


def migrate_file(path: Path) -> tuple[int, int]:
    """Rewrite `path` in today's layout; (rows changed, rows in the file)."""
    rows = read_records(path)
    new = [migrated(row) for row in rows]
    changed = sum(old != row for old, row in zip(rows, new, strict=True))
    if changed:
        shutil.copyfile(path, path.with_name(path.name + ".bak"))
        path.write_text("".join(json.dumps(row) + "\n" for row in new))
    return changed, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="results JSONL files")
    for path in parser.parse_args().files:
        changed, total = migrate_file(path)
        print(f"{path}: {changed} of {total} rows brought to today's layout")


if __name__ == "__main__":
    main()

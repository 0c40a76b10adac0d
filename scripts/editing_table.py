"""Each base sampler beside itself under token editing: accuracy and mean NFE per editing setting, one row per base.

    python scripts/editing_table.py docs/results/editing_sudoku.jsonl

The rows come from `evaluate.py sweep=editing_<task>` (conf/sweep/editing_*.yaml): every base rule on its own and
under `sampler=editing` at each editing `threshold` and `post_steps`. A base is matched to its editing runs by its
rule and settings (`mdmkit.io.naming`), so the table reads across: same base, same test examples, editing on or off.
Cells are "accuracy @ mean NFE"; the difference to the base's accuracy follows in points. Bases are listed by
rule, each rule's from the most forwards to the fewest.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from mdmkit.analysis.pages import run_script
from mdmkit.io.naming import sampler_family, sampler_settings, settings_items
from mdmkit.io.results import read_records

EDITING = "mdmkit.samplers.EditingSampler"


def base_key(sampler: Mapping[str, Any]) -> tuple[str, str, str]:
    """A base sampler as its class, ordering and settings: a grid's partial config (`{_target_: ..., k: 1}`, the
    other fields at their defaults) matches the full config of the same sampler."""
    settings = sorted((key, repr(value)) for key, value in settings_items(sampler))
    return str(sampler["_target_"]), str(sampler.get("ordering", "confidence")), repr(settings)


def cell(row: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> str:
    text = f"{100 * row['accuracy']:.1f}% @ {row['nfe_mean']:.1f}"
    if base is not None:
        text += f" ({100 * (row['accuracy'] - base['accuracy']):+.1f})"
    return text


def editing_table(rows: Sequence[Mapping[str, Any]]) -> str:
    plain: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    edited: dict[tuple[tuple[str, str, str], tuple[float, int]], Mapping[str, Any]] = {}
    for row in rows:
        if row.get("kind") != "evaluate":
            continue
        sampler = row["sampler"]
        if sampler.get("_target_") == EDITING:
            edited[(base_key(sampler["base"]), (sampler["threshold"], sampler["post_steps"]))] = row
        else:
            plain.setdefault(base_key(sampler), row)
    settings = sorted({setting for _, setting in edited}, key=lambda s: (-s[0], s[1]))
    head = ["base", "no editing"] + [f"editing > {t}, post {p}" for t, p in settings]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    # by rule, then from the most forwards to the fewest, whatever order the file holds them in
    for key, base in sorted(plain.items(), key=lambda item: (sampler_family(item[1]["sampler"]),
                                                             -item[1]["nfe_mean"])):
        name = f"{sampler_family(base['sampler'])} {sampler_settings(base['sampler'])}".strip()
        cells = [name, cell(base)] + [cell(edited[(key, s)], base) if (key, s) in edited else "—" for s in settings]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a results JSONL file")
    args = parser.parse_args(argv)
    print(editing_table(read_records(args.results)))


if __name__ == "__main__":
    run_script(main, "editing_table.py")

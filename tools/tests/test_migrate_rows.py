"""tools/migrate_rows.py: old rows gain today's fields; rows that store their measurement are keyed again."""

from __future__ import annotations

import json
from pathlib import Path

from mdmkit.io.results import evaluation_key, read_records
from tools.migrate_rows import migrate_file

EB = {"_target_": "mdmkit.samplers.EBSampler", "gamma": 1, "ordering": "confidence"}
MEASUREMENT = {"checkpoint": "0123456789abcdef", "data": {"task": "f"}, "seed": 0, "limit": 8, "batch_size": 4}


def test_old_rows_gain_todays_fields_and_stored_measurements_are_keyed_again(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    old = {"kind": "evaluate", "key": "old-key", "sampler": EB}  # before `preset` and `measurement` were stored
    stale = {"kind": "evaluate", "key": "stale", "sampler": EB, "measurement": MEASUREMENT, "preset": "eb",
             "family": "eb-confidence"}
    train = {"kind": "train", "sampler": EB}
    path.write_text("".join(json.dumps(row) + "\n" for row in (old, stale, train)))
    assert migrate_file(path) == (2, 3)
    first, second, third = read_records(path)
    assert first == {**old, "preset": None, "family": "eb-confidence"}  # its key cannot be made again: kept
    assert second == {**stale, "key": evaluation_key("evaluate", {**EB, "gamma": 1.0}, MEASUREMENT)}
    assert third == train
    assert json.loads((tmp_path / "rows.jsonl.bak").read_text().splitlines()[1]) == stale
    assert migrate_file(path) == (0, 3)  # idempotent

"""scripts/editing_table.py: each base beside its editing runs, a grid's partial base config matched to the full one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import WAIT_S

ROOT = Path(__file__).resolve().parents[1]
TOPK = "mdmkit.samplers.TopKSampler"


def _row(sampler: dict, accuracy: float, nfe: float) -> dict:
    return {"kind": "evaluate", "sampler": sampler, "accuracy": accuracy, "nfe_mean": nfe}


def test_editing_runs_sit_beside_their_base(tmp_path: Path) -> None:
    full = {"_target_": TOPK, "ordering": "confidence", "temperature": 0.0, "block_length": 8, "cache": "none", "k": 2}
    rows = [
        _row(full, 0.5, 10.0),
        _row({**full, "k": 4}, 0.4, 5.0),
        # a sweep's base: only the fields it sets, in another order
        _row({"_target_": "mdmkit.samplers.EditingSampler", "threshold": 0.9, "post_steps": 0,
              "base": {"_target_": TOPK, "k": 2, "block_length": 8}}, 0.45, 10.0),
        _row({"_target_": "mdmkit.samplers.EditingSampler", "threshold": 0.99, "post_steps": 4,
              "base": {"_target_": TOPK, "k": 2, "block_length": 8}}, 0.55, 11.5),
    ]
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run([sys.executable, "scripts/editing_table.py", str(results)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "| base | no editing | editing > 0.99, post 4 | editing > 0.9, post 0 |"
    assert lines[2] == ("| topk-confidence block_length=8, k=2 | 50.0% @ 10.0 | 55.0% @ 11.5 (+5.0) | "
                        "45.0% @ 10.0 (-5.0) |")
    assert lines[3] == "| topk-confidence block_length=8, k=4 | 40.0% @ 5.0 | — | — |"

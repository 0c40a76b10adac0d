"""tools/device/device_rl_step.sh: the RL-step benchmark in one device call, dry-run on a CPU at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_rl_step.sh"


def test_one_call_brings_back_the_page_with_and_without_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "out"
    environment = {
        **os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEVICE": "cpu", "WHEELS": str(tmp_path),
        "MDMKIT_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1",
        "BENCH_ARGS": "--llm tiny --llm-group 2 --prompt-len 8 --gen-len 16 --block 8 --lora-r 2 --steps 1 --warmup 0",
    }
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"rl_step_gpu.md", "rl_step_gpu.json", "rl_step_gpu.png", "rl_step.log"}
    record = json.loads((out / "rl_step_gpu.json").read_text())
    assert [(r["model"], r["reference"]) for r in record["rows"]] == [("tiny", True), ("tiny", False)]
    for row in record["rows"]:
        assert row["nfe"] == 16 / 2 and row["mu"] == 2 and row["checkpointing"]  # 16 tokens, 2 per forward
        assert row["step_s"] == row["rollout_s"] + row["scoring_s"] + row["update_s"]
    assert "--budget-s 300" in record["command"] and "--sudoku none" in record["command"]

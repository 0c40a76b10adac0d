"""tools/device/device_sft_step.sh: the SFT-step benchmark in one device call, dry-run on a CPU at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_sft_step.sh"


def test_one_call_brings_back_the_page_of_four_cases(tmp_path: Path) -> None:
    out = tmp_path / "out"
    environment = {
        **os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEVICE": "cpu", "WHEELS": str(tmp_path),
        "MDMKIT_CACHE_DIR": str(tmp_path),
        "BENCH_ARGS": "--preset tiny --batch 2 --length 16 --lora-r 2 --steps 1 --warmup 0 --dtype float32",
    }
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"sft_step_gpu.md", "sft_step_gpu.json", "sft_step_gpu.png",
                                               "sft_step.log"}
    record = json.loads((out / "sft_step_gpu.json").read_text())
    assert [(r["method"], r["checkpointing"]) for r in record["rows"]] == [
        ("full", False), ("full", True), ("lora", False), ("lora", True)]
    assert all("tokens_per_s" in r for r in record["rows"])
    assert "--budget-s 300" in record["command"] and record["setup"]["preset"] == "tiny"

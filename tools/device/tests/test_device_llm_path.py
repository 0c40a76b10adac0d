"""tools/device/device_llm_path.sh: the LLM-path benchmark in one device call, dry-run on a CPU at a tiny scale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_llm_path.sh"


def test_one_call_brings_back_the_page_and_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    environment = {
        **os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEVICE": "cpu", "WHEELS": str(tmp_path),
        "MDMKIT_CACHE_DIR": str(tmp_path),
        "BENCH_ARGS": "--models llada-8b --scale 64,1 --prompts 24 --answer 16 --block 8 --steps-per-block 2 "
                      "--batches 1 --rules steps --rule-batches 1 --card H200",
    }
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"llm_path_gpu.md", "llm_path_gpu.json", "llm_path_gpu.jsonl",
                                               "llm_path_gpu.png", "llm_path.log"}
    rows = [json.loads(line) for line in (out / "llm_path_gpu.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in rows if "mode" in r] == ["none", "prefix", "dual", "block"]
    assert [r["rule"] for r in rows if "rule" in r] == ["steps"]
    assert "--budget-s 420" in json.loads((out / "llm_path_gpu.json").read_text())["command"]


def test_the_call_covers_every_model_of_the_benchmark_llada_and_dream_first() -> None:
    from benchmarks.bench_llm_path import MODELS

    [line] = [line for line in SCRIPT.read_text().splitlines() if line.startswith("MODELS=")]
    order = line.split(":-", 1)[1].rstrip("}").split()
    assert sorted(order) == sorted(MODELS) and order[:2] == ["llada-8b", "dream-7b"]

"""The RL-step benchmark at a tiny size: the Sudoku model's and a tiny LLaDA network's cases in one run, each step's
time split into rollouts, scoring and updates, and the page that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_rl_step

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_one_run_splits_each_cases_step_into_rollouts_scoring_and_updates(tmp_path: Path) -> None:
    out = tmp_path / "rl_step"
    bench_rl_step.main(["--prompts", "1", "--group", "2", "--llm", "tiny", "--llm-prompts", "1", "--llm-group", "2",
                        "--prompt-len", "4", "--gen-len", "8", "--block", "4", "--lora-r", "2", "--steps", "1",
                        "--warmup", "0", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["model"], r["sampler"].split(",")[0], r["reference"]) for r in rows] == [
        ("sudoku", "threshold", True), ("sudoku", "threshold", False), ("sudoku", "top-1", True),
        ("tiny", "top-2", True), ("tiny", "top-2", False)]
    for row in rows:
        assert row["step_s"] == row["rollout_s"] + row["scoring_s"] + row["update_s"]
        assert row["rollout_over_update"] == row["rollout_s"] / row["update_s"] and row["mu"] == 2
    top_1 = rows[2]
    assert top_1["nfe"] == top_1["steps"][0]["nfe"] >= 30  # one blank cell per forward: 30-36 givens, 45-51 blanks
    assert all(r["nfe"] == 8 / 2 for r in rows[3:])  # 8 positions, 2 per forward
    assert rows[3]["trained_parameters"] < 10_000  # LoRA's adapters only
    markdown = out.with_suffix(".md").read_text()
    assert "python -m benchmarks.bench_rl_step --prompts 1" in markdown and markdown.count("| sudoku |") == 3
    assert out.with_suffix(".png").stat().st_size > 0

"""The SFT-step benchmark on a tiny network: four cases measured in one run, and the page that shows them."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_sft_step

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_run_measures_full_and_lora_with_and_without_checkpointing(tmp_path):
    out = tmp_path / "sft_step"
    bench_sft_step.main(["--preset", "tiny", "--batch", "2", "--length", "16", "--lora-r", "2", "--steps", "1",
                         "--warmup", "0", "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())
    rows = record["rows"]
    assert [(r["method"], r["checkpointing"]) for r in rows] == list(bench_sft_step.CASES)
    assert all(r["tokens_per_s"] > 0 and r["peak_bytes"] > 0 and r["final_loss"] > 0 for r in rows)
    full, lora = (next(r for r in rows if r["method"] == m and not r["checkpointing"]) for m in ("full", "lora"))
    assert full["trainable_parameters"] == record["parameters"]
    assert lora["trainable_parameters"] < full["trainable_parameters"] / 10
    assert full["tokens_per_s_vs_full"] == full["peak_vs_full"] == 1.0
    saved = {(r["method"], r["checkpointing"]): r["saved_bytes"] for r in rows}
    assert all(saved[method, True] < saved[method, False] for method in ("full", "lora"))  # blocks' inputs only
    markdown = out.with_suffix(".md").read_text()
    assert "python -m benchmarks.bench_sft_step --preset tiny" in markdown
    assert markdown.count("| LoRA r2") == 2 and "| full + checkpointing |" in markdown
    assert out.with_suffix(".png").stat().st_size > 0

"""The KV-cache page (benchmarks/bench_cache.py): equal NFE across cache modes, the per-round ratios, the accuracy
comparison within a setting, and the files a smoke run writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WAIT_S

from benchmarks.kv_cache_page import accuracy_entries, speed_goal_lines
from benchmarks.kv_cache_speed import (
    Generation,
    SpeedSetup,
    canvas,
    generate,
    llada_like,
    random_network,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _threads(one_thread: None) -> None:
    """Tiny forwards: one intra-op thread."""


def test_every_cache_mode_does_the_same_forwards_and_fewer_tokens():
    network = random_network(llada_like(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, vocab_size=50))
    setup = SpeedSetup(prompt=10, answer=8, block_length=4, steps_per_block=2)
    tokens = canvas(setup, 2, network.vocab_size, network.mask_id)
    assert (tokens[:, :10] != network.mask_id).all() and (tokens[:, 10:] == network.mask_id).all()
    runs = {mode: generate(network, tokens, mode, setup) for mode in ("none", "prefix", "dual")}
    assert {run.nfe for run in runs.values()} == {2 * setup.nfe} and setup.nfe == 4
    # per block: one full forward (18 tokens), then one query forward; prefix runs the block to the end
    assert runs["none"].computed_tokens == 2 * 4 * 18
    assert runs["prefix"].computed_tokens == 2 * (18 + 8 + 18 + 4)
    assert runs["dual"].computed_tokens == 2 * (18 + 4 + 18 + 4)
    assert all(0 < run.forward_seconds <= run.seconds for run in runs.values())


def test_block_diffusion_spends_the_same_forwards_on_whole_blocks_and_runs_only_its_block():
    network = random_network(llada_like(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, vocab_size=50))
    setup = SpeedSetup(prompt=8, answer=8, block_length=4, steps_per_block=2)
    tokens = canvas(setup, 2, network.vocab_size, network.mask_id)
    block, none = generate(network, tokens, "block", setup), generate(network, tokens, "none", setup)
    assert block.nfe == none.nfe == 2 * setup.nfe
    # per row: the prompt's commit (8 tokens and the query slot of the first answer token), one step on the
    # first block, its commit (4 + 1), one step on the last block
    assert block.computed_tokens == 2 * (9 + 4 + 5 + 4)


def test_speed_ups_are_per_round_ratios_against_none():
    setup = SpeedSetup(answer=4, batches=(2,), repeats=2)
    runs = {2: {"none": [Generation(8.0, 7.0, 8, 80), Generation(12.0, 11.0, 8, 80)],
                "dual": [Generation(2.0, 1.0, 8, 20), Generation(4.0, 3.0, 8, 20)]}}
    entries = {e["mode"]: e for e in summarize(runs, setup)}
    dual = entries["dual"]
    assert dual["speedup_over_none"]["per_repeat"] == [4.0, 3.0] and dual["speedup_over_none"]["median"] == 3.5
    assert dual["speedup_over_none_of_medians"] == pytest.approx(10.0 / 3.0)
    assert dual["ms_per_token"]["per_repeat"] == [250.0, 500.0]  # seconds / (batch 2 x 4 tokens)
    assert dual["tokens_per_forward"] == 2.5 and dual["nfe_per_row"] == 4
    assert entries["none"]["speedup_over_none"]["median"] == 1.0
    assert speed_goal_lines(list(entries.values()), 2.0) == [
        "- batch 2: dual is 3.50x as fast as none per token (meets the 2x goal)."]


def _row(sampler: str, cache: str, accuracy: float, **knobs: float) -> dict:
    return {"kind": "evaluate", "key": f"{sampler}{knobs}{cache}", "accuracy": accuracy, "nfe_mean": 10.0,
            "accuracy_ci95": [accuracy - 0.05, accuracy + 0.05], "n": 100, "checkpoint": "m.pt",
            "checkpoint_sha": "abc", "computed_tokens_mean": 300.0, "tokens_per_forward_mean": 30.0,
            "sampler": {"_target_": f"mdmkit.samplers.{sampler}", "ordering": "confidence", "block_length": 8,
                        "cache": cache, "cache_refresh": None, **knobs}}


def test_accuracy_is_compared_within_a_setting():
    rows = [_row("ThresholdSampler", "dual", 0.7, tau=0.9), _row("ThresholdSampler", "none", 0.8, tau=0.9),
            _row("ThresholdSampler", "prefix", 0.75, tau=0.7), _row("EBSampler", "dual", 0.5, gamma=0.1)]
    entries = accuracy_entries(rows)
    assert [(e["sampler"], e["cache"]) for e in entries] == [
        ("eb-confidence", "dual"), ("threshold-confidence", "prefix"), ("threshold-confidence", "none"),
        ("threshold-confidence", "dual")]
    assert entries[3]["setting"] == "block_length=8, tau=0.9"
    assert entries[3]["accuracy_change"] == pytest.approx(-0.1)
    assert entries[0]["accuracy_change"] is None and entries[1]["accuracy_change"] is None  # no none row


def test_smoke_run_writes_the_page(tmp_path):
    out = tmp_path / "kv_cache"
    rows = [_row("TopKSampler", "none", 0.6, k=1), _row("TopKSampler", "dual", 0.55, k=1)]
    out.with_name("kv_cache.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "-m", "benchmarks.bench_cache", "--quick", "--threads", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.with_name("kv_cache.json").read_text())
    assert {e["mode"] for e in record["speed"]["entries"]} == {"none", "prefix", "dual", "block"}
    assert {e["batch"] for e in record["speed"]["entries"]} == {1, 2}
    assert {"git_commit", "machine", "command"} <= set(record)
    assert [e["accuracy_change"] for e in record["accuracy"]["entries"]] == [0.0, pytest.approx(-0.05)]
    page = out.with_name("kv_cache.md").read_text()
    assert "--quick" in page and "| topk-confidence | block_length=8, k=1 | dual | 55.0% (50.0-60.0) | -5.0 |" in page
    assert "GPU: not measured" in page
    assert out.with_name("kv_cache.png").read_bytes()[:4] == b"\x89PNG"

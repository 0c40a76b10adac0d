"""The GPU benchmark of the LLM path, run on this CPU at a tiny scale: what its page claims follows from its rows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from benchmarks import bench_llm_path, llm_path_canvas
from benchmarks.llm_path import CARDS, PRESETS, SyncCounter, measured_card, own_block, random_llm, scaled
from benchmarks.llm_roofline import _moe_seconds
from benchmarks.roofline import Hardware

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sync_counter_splits_the_loops_waits_from_the_networks():
    counter = SyncCounter()
    values = torch.arange(4)
    with counter.counting():
        values.sum().item()
        bool(values.any())
        with counter.inside():
            values.nonzero()
            values.tolist()
            int(values[0])
    assert (counter.loop, counter.network) == (2, 3)
    bool(values.any())  # outside `counting`: not counted
    assert (counter.loop, counter.network) == (2, 3)


def test_scaled_presets_keep_the_vocabulary_and_the_head_ratio():
    dream = scaled(PRESETS["dream-7b"], 256, 2)
    assert (dream.vocab_size, dream.n_layers, dream.qkv_bias, dream.shift_logits) == (152064, 2, True, True)
    assert dream.n_heads % dream.n_kv_heads == 0 and dream.d_model % dream.n_heads == 0
    network = random_llm(scaled(PRESETS["llada-8b"], 64, 1), torch.device("cpu"), torch.bfloat16)
    assert {p.dtype for p in network.parameters()} == {torch.bfloat16}
    assert all(bool((p == 1).all()) for n, p in network.named_parameters() if n.endswith("norm.weight"))
    sdar = scaled(PRESETS["sdar-4b"], 512, 2)  # Qwen3-4B's heads of 128, wider than 2560 / 32: kept
    assert (sdar.head_dim, sdar.head_width, PRESETS["sdar-4b"].d_model // PRESETS["sdar-4b"].n_heads) == (128, 128, 80)
    assert random_llm(scaled(PRESETS["sdar-4b"], 64, 1), torch.device("cpu"), torch.float32).blocks[0].attn.q.weight \
        .shape == (128, 64)


@pytest.mark.parametrize(("name", "width", "hidden"), [("sdar-4b", 2560, 9728), ("sdar-8b", 4096, 12288)])
def test_sdar_shapes_are_what_the_kind_reads_from_their_config(tmp_path, name, width, hidden):
    from mdmkit.models.llm.checkpoints import read_config

    config = {"model_type": "sdar", "vocab_size": 151936, "hidden_size": width, "num_hidden_layers": 36,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": hidden,
              "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "block_size": 4,
              "mask_token_id": 151669, "max_position_embeddings": 40960, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = read_config(tmp_path, "sdar")  # the preset's positions cover prompt 1024 + 256 only
    assert replace(read, max_positions=PRESETS[name].max_positions) == PRESETS[name]


def test_block_causal_networks_decode_in_blocks_no_larger_than_they_were_trained_in():
    assert own_block(PRESETS["sdar-8b"], 32, 8) == (4, 2)  # SDAR's 4: a quarter of the forwards per block
    assert own_block(PRESETS["sdar-4b"], 8, 16) == (4, 8)
    assert own_block(PRESETS["sdar-4b"], 32, 4) == (4, 2)  # at least a step and the committing forward
    assert own_block(PRESETS["llada2-mini"], 32, 8) == own_block(PRESETS["llada-8b"], 32, 8) == (32, 8)
    assert own_block(PRESETS["llada2-mini"], 8, 2) == (8, 2)  # smaller than trained in: the run's


def test_the_canvas_roofline_reads_the_experts_its_tokens_touch():
    bandwidth = Hardware("memory bound", 1e30, 1e30, 1e12)
    d, hidden = 2816, 704
    one = _moe_seconds(1, d, 128, 8, hidden, bandwidth, 2)  # one token: its 8 experts' 3 matrices, in and out
    assert one == (3 * d * 8 * hidden + 2 * d) * 2 / 1e12
    many = _moe_seconds(4096, d, 128, 8, hidden, bandwidth, 2)  # thousands of tokens: every expert
    assert abs(many - (3 * d * 128 * hidden + 2 * 4096 * d) * 2 / 1e12) < 1e-12


def test_a_cpu_run_writes_a_page_whose_rows_have_equal_nfe_across_caches(tmp_path):
    out = tmp_path / "llm_path"
    bench_llm_path.main(["--models", "llada-8b", "fast-dllm-v2-7b", "llada2-mini", "--scale", "64,2", "--prompts", "40",
                         "--answer", "16", "--block", "8", "--steps-per-block", "2", "--batches", "1", "2",
                         "--repeats", "1", "--rules", "steps", "wino", "--rule-batches", "1", "--card", "H100",
                         "--predict", "H200", "--out", str(out)])
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    for causal in ("fast-dllm-v2-7b", "llada2-mini"):  # no approximate cache on a block-causal network
        done = [(r["batch"], r["mode"], r["nfe_per_row"]) for r in rows if r.get("model") == causal]
        assert done == [(b, m, 4.0) for b in (1, 2) for m in ("none", "block")]
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["active_parameters"]["llada2-mini"] < record["parameters"]["llada2-mini"]
    cases = [r for r in rows if "mode" in r and r["model"] == "llada-8b"]
    modes = ("none", "prefix", "dual", "block")
    assert [(c["batch"], c["mode"]) for c in cases] == [(b, m) for b in (1, 2) for m in modes]
    assert {c["nfe_per_row"] for c in cases} == {4.0}  # 2 blocks x 2 steps in every mode (block: 1 + its commit)
    assert all(c["forwards"] == 4 and c["roofline_ms_per_forward"] > 0 for c in cases)
    # a dual forward computes the block only, a plain one the whole canvas: a smaller roofline
    by_mode = {c["mode"]: c for c in cases if c["batch"] == 1}
    assert by_mode["dual"]["roofline_ms_per_forward"] < by_mode["none"]["roofline_ms_per_forward"]
    # the same forwards at LLaDA-8B's real size on an H200: each reads at least the layers' 14 GB of bf16 weights
    assert all(c["predicted_ms_per_forward"] > 14e9 / 4.8e12 * 1e3 for c in cases)
    assert by_mode["dual"]["predicted_tokens_per_s"] > by_mode["none"]["predicted_tokens_per_s"]
    assert all(c["loop_syncs_per_forward"] > 0 for c in cases)
    rules = {r["rule"]: r for r in rows if "rule" in r}
    assert rules["steps"]["cache"] == "dual" and rules["wino"]["cache"] == "none"  # WINO reruns the canvas
    page = out.with_suffix(".md").read_text()
    assert "python -m benchmarks.bench_llm_path --models llada-8b" in page and "NVIDIA H100 SXM" in page
    assert "H200 bf16 bound tokens/s" in page and "at the real size in bf16 on the H200 it allows" in page
    assert out.with_suffix(".png").stat().st_size > 0
    before = page
    bench_llm_path.main(["--page-only", "--out", str(out)])
    assert out.with_suffix(".md").read_text() == before


def test_diffusion_gemma_at_the_hub_values_has_the_model_cards_parameters():
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(llm_path_canvas.gemma_config())
    total, active = llm_path_canvas.text_parameters(type("Network", (), {"model": model})())
    assert 25.2e9 < total < 25.3e9 and 3.8e9 < active < 3.9e9  # its card: 25.2B parameters, 3.8B active
    config = llm_path_canvas.gemma_config()  # a random prompt never holds an image id (the network refuses those)
    ids = torch.tensor([[5, config.image_token_id, config.boi_token_id, config.eoi_token_id, 262144, 7]])
    assert llm_path_canvas.text_only(ids, config).tolist() == [[5, 0, 0, 0, 262144, 7]]


def test_the_new_families_run_their_own_decoding_at_a_fixed_schedule(tmp_path):
    out = tmp_path / "llm_path"
    bench_llm_path.main(["--models", "llada2.1-mini", "sdar-4b", llm_path_canvas.NAME, "--scale", "64,1",
                         "--prompts", "24", "--answer", "16", "--block", "8", "--steps-per-block", "3",
                         "--canvas-steps", "2", "--batches", "1", "--repeats", "1", "--rules", "--card", "H100",
                         "--predict", "H200", "--out", str(out)])
    rows = {(r["model"], r["mode"]): r for r in map(json.loads, out.with_suffix(".jsonl").read_text().splitlines())}
    assert sorted(rows) == [("diffusiongemma-26b-a4b", "canvas"), ("llada2.1-mini", "block"),
                            ("llada2.1-mini", "none"), ("sdar-4b", "block"), ("sdar-4b", "none")]
    # LLaDA2.1: 2 blocks x (1 M2T step with edits + its post step + block's committing forward; none: 2 steps + post)
    assert rows["llada2.1-mini", "none"]["nfe_per_row"] == rows["llada2.1-mini", "block"]["nfe_per_row"] == 6.0
    assert rows["sdar-4b", "none"]["nfe_per_row"] == rows["sdar-4b", "block"]["nfe_per_row"] == 8.0  # 4 blocks of 4
    gemma = rows["diffusiongemma-26b-a4b", "canvas"]  # one canvas of 16: 2 decoder forwards, one encoder pass
    assert (gemma["nfe_per_row"], gemma["forwards"], gemma["encoder_passes"]) == (2.0, 2, 1)
    assert gemma["encoder_roofline_ms"] > 0 and gemma["roofline_ms_per_forward"] > 0
    # at the real size on an H200 a decoder forward reads at least the 2.4B parameters outside the experts
    assert gemma["predicted_ms_per_forward"] > 2.4e9 * 2 / CARDS["H200"].memory_bandwidth * 1e3
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["decoding"]["sdar-4b"] == "blocks of 4, 2 forwards a block"
    assert set(record["decoding"]) == {"llada2.1-mini", "sdar-4b", llm_path_canvas.NAME}
    page = out.with_suffix(".md").read_text()
    assert "## diffusiongemma-26b-a4b" in page and "the encoder's pass over the prompt" in page


def test_a_model_this_python_cannot_make_leaves_one_error_row(tmp_path, monkeypatch):
    def missing(*args: object, **kwargs: object) -> None:
        raise ImportError("cannot import name 'DiffusionGemmaForBlockDiffusion'")

    monkeypatch.setattr(llm_path_canvas, "random_gemma", missing)
    out = tmp_path / "llm_path"
    bench_llm_path.main(["--models", llm_path_canvas.NAME, "--scale", "64,1", "--prompts", "24", "--answer", "16",
                         "--block", "8", "--batches", "1", "2", "--rules", "--card", "H100", "--out", str(out)])
    [row] = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert row["mode"] == "canvas" and row["error"].startswith("cannot be made here: cannot import name")
    assert "## diffusiongemma-26b-a4b" in out.with_suffix(".md").read_text()


def test_a_device_without_a_data_sheet_gets_its_roofline_measured():
    card = measured_card(torch.device("cpu"), torch.float32, "CPU")
    assert card.name.startswith("CPU, measured:") and "float32 matmul" in card.name
    assert card.peak_flops == card.attention_peak_flops > 0 and card.memory_bandwidth > 0


def test_revisions_page_compares_each_case_by_the_median_of_its_rounds(tmp_path):
    from benchmarks import bench_llm_path_revisions

    runs = tmp_path / "runs"
    runs.mkdir()
    case = {"model": "llada-8b", "prompt": 64, "batch": 1, "mode": "dual", "loop_share": 0.1, "ms_per_forward": 10.0}
    for name, speeds, syncs in (("before", (10.0, 12.0, 30.0), 10.0), ("after", (20.0, 24.0, 26.0), 4.0)):
        for round_, speed in enumerate(speeds, 1):
            rows = [{**case, "tokens_per_s": speed, "loop_syncs_per_forward": syncs},
                    {"model": "llada-8b", "rule": "eb", "batch": 1}]  # rule rows are not compared
            (runs / f"{name}-{round_}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "changes"
    bench_llm_path_revisions.main(["--before", "aaa", "--after", "bbb", "--rounds", "3", "--runs", str(runs),
                                   "--out", str(out), "--", "--scale", "64,1"])
    record = json.loads(out.with_suffix(".json").read_text())
    [entry] = record["entries"]
    assert entry["tokens_per_s"] == {"before": 12.0, "after": 24.0, "ratio": 2.0}
    assert entry["loop_syncs_per_forward"]["ratio"] == 0.4
    assert "**2.00x**" in out.with_suffix(".md").read_text() and record["bench"] == ["--scale", "64,1"]

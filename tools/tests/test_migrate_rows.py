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


def test_sampler_targets_named_by_module_path_become_the_public_ones_nested_too(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rule = {"_target_": "mdmkit.samplers.topk.TopKSampler", "k": 2}
    ni = {"_target_": "mdmkit.samplers.ni.NISampler", "base": rule, "epsilon": 0.9}
    measured = {"kind": "evaluate", "key": "stale", "sampler": ni, "measurement": MEASUREMENT, "preset": "ni",
                "family": "ni-topk-confidence"}
    unmeasured = {"kind": "evaluate", "key": "kept", "preset": None, "family": "speculative-random",
                  "sampler": {"_target_": "mdmkit.samplers.speculative.SpeculativeSampler"},
                  "train_config": {"sampler": {"_target_": "mdmkit.samplers.speculative.WindowSampler"},
                                   "task": {"_target_": "mdmkit.tasks.sudoku.SudokuTask"}}}
    train = {"kind": "train", "config": {"sampler": {"_target_": "mdmkit.samplers.p2_listing.P2ListingSampler"}}}
    path.write_text("".join(json.dumps(row) + "\n" for row in (measured, unmeasured, train)))
    assert migrate_file(path) == (3, 3)
    first, second, third = read_records(path)
    base = {**rule, "_target_": "mdmkit.samplers.TopKSampler"}
    public = {**ni, "_target_": "mdmkit.samplers.NISampler", "base": base}
    assert first == {**measured, "sampler": public, "key": evaluation_key("evaluate", public, MEASUREMENT)}
    assert first["key"] != "stale"
    assert second["key"] == "kept" and second["sampler"] == {"_target_": "mdmkit.samplers.SpeculativeSampler"}
    assert second["train_config"] == {"sampler": {"_target_": "mdmkit.samplers.WindowSampler"},
                                      "task": {"_target_": "mdmkit.tasks.sudoku.SudokuTask"}}  # not a sampler: kept
    assert third == {"kind": "train", "config": {"sampler": {"_target_": "mdmkit.samplers.P2ListingSampler"}}}
    assert migrate_file(path) == (0, 3)  # idempotent


def test_llada2s_rule_loses_the_masked_loop_fields_it_no_longer_has_and_its_family_follows(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    inherited = {"ordering": "confidence", "temperature": 1.0, "top_p": 1.0, "block_length": None,
                 "stop_early": True, "cache": "none", "cache_refresh": None, "mask_in_softmax": True}
    old_rule = {"_target_": "mdmkit.samplers.llada2.Llada2Sampler", **inherited, "steps": 4, "tau": 0.95, "top_k": 0}
    sampler = {"_target_": "mdmkit.samplers.BlockDiffusionSampler", "block_size": 16, "rule": old_rule}
    row = {"kind": "evaluate", "key": "stale", "preset": "llada2", "family": "blockdiffusion-llada2-confidence",
           "sampler": sampler, "measurement": MEASUREMENT}
    path.write_text(json.dumps(row) + "\n")
    assert migrate_file(path) == (1, 1)
    (new,) = read_records(path)
    rule = {"_target_": "mdmkit.samplers.Llada2Sampler", "temperature": 1.0, "top_p": 1.0, "stop_early": True,
            "steps": 4, "tau": 0.95, "top_k": 0, "mask_never_drawn": True}  # it drew without the mask token
    assert new["sampler"] == {**sampler, "rule": rule}
    assert new["family"] == "blockdiffusion-llada2"
    # keyed as a run of today's config is: the fields at their defaults count for nothing
    assert new["key"] == evaluation_key("evaluate", {**sampler, "rule": {
        "_target_": rule["_target_"], "steps": 4, "temperature": 1.0, "mask_never_drawn": True}}, MEASUREMENT)
    assert migrate_file(path) == (0, 1)


def test_llada2_rows_from_before_the_mask_token_was_drawn_say_so_and_are_no_longer_todays(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rule = {"_target_": "mdmkit.samplers.Llada2Sampler", "steps": 32, "temperature": 1.0}
    sampler = {"_target_": "mdmkit.samplers.BlockDiffusionSampler", "block_size": 32, "rule": rule}
    today = {**sampler, "rule": {**rule, "mask_never_drawn": False}}
    rows = [{"kind": "evaluate", "key": "stale", "preset": "llada2", "family": "blockdiffusion-llada2",
             "sampler": value, "measurement": MEASUREMENT} for value in (sampler, today)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert migrate_file(path) == (2, 2)  # both keyed again; only the old one's sampler changes
    old, new = read_records(path)
    assert old["sampler"]["rule"]["mask_never_drawn"] is True and new["sampler"] == today
    assert old["key"] != new["key"] == evaluation_key("evaluate", sampler, MEASUREMENT)  # today's default: no key
    assert migrate_file(path) == (0, 2)


def test_fast_dllm_v2_preset_rows_from_before_attention_block_take_the_presets_where_it_is_the_same(
        tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rule = {"_target_": "mdmkit.samplers.ThresholdSampler", "tau": 0.9, "mask_in_softmax": True}

    def row(block: int, preset: str, **fields: object) -> dict:
        sampler = {"_target_": "mdmkit.samplers.BlockDiffusionSampler", "block_size": block, "sub_block": 8,
                   "rule": rule, "prompt_block_unseen": True, **fields}
        return {"kind": "evaluate", "key": "stale", "preset": preset, "family": "blockdiffusion-threshold-confidence",
                "sampler": sampler, "params": {k: v for k, v in sampler.items() if k != "_target_"},
                "measurement": MEASUREMENT}

    rows = [row(32, "fast_dllm_v2"), row(64, "fast_dllm_v2"), row(32, "block_diffusion")]
    path.write_text("".join(json.dumps(value) + "\n" for value in rows))
    migrate_file(path)
    blocks32, blocks64, plain = read_records(path)
    # blocks of 32: the whole block is the preset's 32, so the row is keyed as the preset runs today
    assert blocks32["sampler"]["attention_block"] == blocks32["params"]["attention_block"] == 32
    assert blocks32["key"] == evaluation_key("evaluate", row(32, "", attention_block=32)["sampler"], MEASUREMENT)
    # blocks of 64 attended over the whole block (null, the default): not the preset's runs today
    assert "attention_block" not in blocks64["sampler"] and "attention_block" not in plain["sampler"]
    assert migrate_file(path) == (0, 3)

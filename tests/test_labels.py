"""Which setting made which number: console lines, tables and rows name the sampler option (preset) and its
settings; presets that configure one rule differently get fronts of their own; rows written before the
`preset` field existed still load, render and resume under their old key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, compose_config, run_cli
from omegaconf import OmegaConf, open_dict

from mdmkit.analysis import pareto, pareto_tables
from mdmkit.analysis.pareto_plot import plot_fronts
from mdmkit.evaluation.distributed import Ranks
from mdmkit.evaluation.evaluate import _Rows, run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.evaluation.sweep import expand
from mdmkit.evaluation.tracking import COLUMNS, table_rows
from mdmkit.io import naming
from mdmkit.io.naming import is_plain_preset, preset_family, run_label, sampler_settings
from mdmkit.io.results import read_records

SUDOKU_PARETO = ROOT / "docs" / "results" / "sudoku_pareto.jsonl"
THRESHOLD = {"_target_": "mdmkit.samplers.ThresholdSampler", "ordering": "confidence", "temperature": 0.0,
             "top_p": 1.0, "block_length": None, "stop_early": True, "cache": "none", "cache_refresh": None, "tau": 0.9}


def result(family: str | None, nfe: float, accuracy: float, sampler: dict, preset: str | None = None) -> dict:
    row = {"kind": "evaluate", "task": "sudoku", "checkpoint": "checkpoints/sudoku_mdm.pt", "checkpoint_sha": "abc",
           "sampler": sampler, "accuracy": accuracy, "nfe_mean": nfe, "n": 100, "time": "2026-01-01T00:00:00",
           "key": f"{preset}-{nfe}"}
    if family is not None:
        row["family"] = family
    if preset is not None:
        row["preset"] = preset
    return row


# ------------------------------------------------------------------------------------------- the names


def test_plain_presets_keep_the_family_name_and_the_others_lead_with_their_own():
    for preset, family in (("eb", "eb-confidence"), ("topk", "topk-margin"), ("ni_eb", "ni-eb-confidence"),
                           ("dream_steps", "dreamsteps-entropy"), ("all", "revealall-confidence"),
                           ("p2_listing", "p2listing-confidence"), ("threshold", "threshold-confidence+dual")):
        assert is_plain_preset(preset, family), preset
        assert preset_family(family, preset) == family
    for preset, family in (("llada", "steps-confidence"), ("fastdllm_threshold", "threshold-confidence"),
                           ("dream_entropy", "dreamsteps-entropy"), ("dream_maskgit_plus", "dreamsteps-confidence")):
        assert not is_plain_preset(preset, family), preset
        assert preset_family(family, preset) == f"{preset} ({family})"
    qualified = preset_family("steps-confidence", "llada")
    assert preset_family(qualified, "llada") == qualified  # idempotent
    assert preset_family("steps-confidence", None) == "steps-confidence"  # rows from before the field
    assert preset_family("oracle", "llada") == "oracle"


def test_settings_name_every_value_that_tells_runs_apart_and_no_noise():
    assert sampler_settings({**THRESHOLD, "tau": 0.7}) == "tau=0.7"  # shared fields at their no-op value left out
    assert sampler_settings({**THRESHOLD, "temperature": 0.7, "block_length": 32, "cache": "dual"}) \
        == "temperature=0.7, block_length=32, tau=0.9"  # a non-default shared value is shown; cache: in family
    ni = {"_target_": "mdmkit.samplers.NISampler", "epsilon": 0.5, "base": {**THRESHOLD, "tau": 0.8}}
    assert sampler_settings(ni) == "epsilon=0.5, base.tau=0.8"
    llada = {**THRESHOLD, "_target_": "mdmkit.samplers.StepsSampler", "steps": 64, "block_length": 32}
    del llada["tau"]
    assert run_label("steps-confidence", llada, "llada") == "llada (steps-confidence) block_length=32, steps=64"
    top1 = {**{k: v for k, v in THRESHOLD.items() if k != "tau"}, "_target_": "mdmkit.samplers.TopKSampler", "k": 1}
    assert run_label("oracle", {"name": "oracle", "reference": top1}) == "oracle floor of topk-confidence k=1"


def test_two_presets_of_one_rule_get_separate_fronts_tables_and_labels():
    fast = {**THRESHOLD, "block_length": 32}
    rows = [result("threshold-confidence", nfe, acc, {**THRESHOLD, "tau": tau}, "threshold")
            for tau, nfe, acc in ((0.9, 10.0, 0.8), (0.5, 5.0, 0.6))]
    rows += [result("threshold-confidence", nfe, acc, {**fast, "tau": tau}, "fastdllm_threshold")
             for tau, nfe, acc in ((0.9, 12.0, 0.7), (0.5, 6.0, 0.5))]
    fronts = pareto.fronts_by_family(rows)
    assert set(fronts) == {"threshold-confidence", "fastdllm_threshold (threshold-confidence)"}
    assert [p.payload["sampler"]["block_length"] for p in fronts["fastdllm_threshold (threshold-confidence)"]] \
        == [32, 32]
    table = pareto_tables.summary_table(rows, reference_accuracy=0.7, keep=0.98).splitlines()
    assert len(table) == 2 + 2
    fast_line = next(line for line in table if line.startswith("| fastdllm_threshold (threshold-confidence) |"))
    assert "block_length=32, tau=0.9" in fast_line  # its lowest-NFE run, named with its settings
    assert fast_line.endswith("| tau ∈ {0.5, 0.9}; block_length=32 |")  # what the family was run with
    runs = pareto_tables.runs_table(rows).splitlines()
    assert any(line.startswith("fastdllm_threshold (threshold-confidence)") and "block_length=32, tau=0.5" in line
               for line in runs)
    long = [result("x-confidence", nfe, 0.5, {**THRESHOLD, **{f"knob_{i}": 1000 + i for i in range(12)}, "tau": tau})
            for nfe, tau in ((1.0, 0.5), (2.0, 0.7))]
    cut = pareto_tables.runs_table(long).splitlines()[1:]  # too long for a terminal line: cut, the swept value kept
    assert [line.split()[1] for line in cut] == ["tau=0.5,", "tau=0.7,"] and all("…" in line for line in cut)
    assert naming.row_label(rows[2]) == "fastdllm_threshold (threshold-confidence) block_length=32, tau=0.9"
    assert naming.row_label(rows[0]) == "threshold-confidence tau=0.9"
    wandb_rows = table_rows(rows)
    assert wandb_rows[2][COLUMNS.index("preset")] == "fastdllm_threshold"
    assert wandb_rows[2][COLUMNS.index("label")] == naming.row_label(rows[2])


def test_old_rows_without_the_field_load_and_render(tmp_path: Path):
    stored = [{k: v for k, v in json.loads(line).items() if k != "preset"}
              for line in SUDOKU_PARETO.read_text().splitlines()]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(row) + "\n" for row in stored))
    rows = pareto.load_rows([tmp_path / "old.jsonl"])
    assert {naming.derive_family(row) for row in rows} == {row["family"] for row in stored}
    assert {row["family"] for row in rows} == {row["family"] for row in stored}  # nothing renamed on loading
    eb = next(row for row in rows if row["family"] == "eb-confidence" and row["sampler"]["gamma"] == 0.001)
    assert naming.row_label(eb) == "eb-confidence gamma=0.001"
    assert "| eb-confidence |" in pareto_tables.summary_table(rows)
    assert plot_fronts(rows, tmp_path / "old.png").read_bytes()[:4] == b"\x89PNG"
    # a row without `family` either (older still) gets one from its config, and mixes with new rows of the
    # plain preset on one front
    bare = {k: v for k, v in eb.items() if k != "family"}
    new = {**eb, "key": "new", "preset": "eb", "nfe_mean": eb["nfe_mean"] + 1}
    assert set(pareto.fronts_by_family([bare, new])) == {"eb-confidence"}


def test_the_key_of_a_row_is_unchanged_by_the_preset():
    cfg = compose_config("evaluate", ["ckpt=model.pt", "sampler=eb", "sampler.gamma=0.0001"])
    rows = _Rows(plan_evaluation(cfg), "model.pt", "0123456789abcdef", "sudoku",
                 {"task": "fingerprint", "test_file": None}, "test examples", "ema", None, Ranks())
    sampler = OmegaConf.to_container(cfg.sampler)
    made = rows.row("evaluate", sampler, {"accuracy": 0.5}, "eb")
    assert made["preset"] == "eb" and "preset" not in made["sampler"]
    assert rows.row("evaluate", sampler, {}, "some_other_preset")["key"] == made["key"]
    assert rows.row("evaluate", {**sampler, "gamma": 0.001}, {}, "eb")["key"] != made["key"]


def test_sweep_jobs_keep_the_option_they_came_from():
    jobs = expand({"entries": [{"sampler": "llada", "grid": {"steps": [8, 16]}}, {"sampler": "eb"},
                               {"sampler": "threshold", "grid": {"block_length": [32], "mask_in_softmax": [True]}},
                               {"sampler": "fastdllm_threshold"}]})  # the same config as the line above
    assert [job.preset for job in jobs] == ["llada", "llada", "eb", "threshold"]


# ------------------------------------------------------------------------------------ through evaluate


def test_sweep_console_lines_table_and_rows_name_preset_and_settings(tiny_checkpoint: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture):
    results = tmp_path / "results.jsonl"
    sweep = {"name": "names", "entries": [{"sampler": "llada", "grid": {"steps": [2, 4]}},
                                          {"sampler": "eb", "grid": {"gamma": [0.001]}}]}
    cfg = compose_config("evaluate", [f"ckpt={tiny_checkpoint}", "limit=4", f"results_file={results}",
                                      "wandb.mode=disabled"])
    with open_dict(cfg):
        cfg.sweep = sweep
    rows = run_evaluation(plan_evaluation(cfg))
    out = capsys.readouterr().out
    assert "[sudoku] llada (steps-confidence) block_length=32, mask_in_softmax=True, steps=2: accuracy " in out
    assert "[sudoku] llada (steps-confidence) block_length=32, mask_in_softmax=True, steps=4: accuracy " in out
    assert "[sudoku] eb-confidence gamma=0.001: accuracy " in out
    table = [line for line in out.splitlines() if line.startswith("llada (steps-confidence) ")]
    assert [line.split()[2:5] for line in table] == [["block_length=32,", "mask_in_softmax=True,", "steps=2"],
                                                     ["block_length=32,", "mask_in_softmax=True,", "steps=4"]]
    stored = read_records(results)
    assert [row["preset"] for row in stored] == ["llada", "llada", "eb"]
    assert [row["family"] for row in stored] == ["steps-confidence", "steps-confidence", "eb-confidence"]
    assert set(pareto.fronts_by_family(stored)) == {"eb-confidence", "llada (steps-confidence)"}

    again = run_evaluation(plan_evaluation(cfg))  # resumed rows are named the same way
    assert capsys.readouterr().out.count("llada (steps-confidence) block_length=32, mask_in_softmax=True, steps=") == 4
    assert [row["preset"] for row in again] == ["llada", "llada", "eb"]
    assert [row["key"] for row in again] == [row["key"] for row in rows]


def test_a_hydra_multirun_over_presets_names_each_and_separates_their_fronts(tiny_checkpoint: Path, tmp_path: Path):
    results = tmp_path / "results.jsonl"
    done = run_cli("evaluate.py", "-m", f"ckpt={tiny_checkpoint}", "sampler=threshold,fastdllm_threshold",
                   "limit=4", "wandb.mode=disabled", f"results_file={results}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[sudoku] threshold-confidence tau=0.9: accuracy " in done.stdout
    assert ("[sudoku] fastdllm_threshold (threshold-confidence) block_length=32, mask_in_softmax=True, tau=0.9: "
            "accuracy ") in done.stdout
    stored = read_records(results)
    assert sorted(row["preset"] for row in stored) == ["fastdllm_threshold", "threshold"]
    assert {row["family"] for row in stored} == {"threshold-confidence"}  # the rule, as before
    assert set(pareto.fronts_by_family(stored)) == {"threshold-confidence",
                                                    "fastdllm_threshold (threshold-confidence)"}

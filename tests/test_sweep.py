"""Evaluation sweeps: grid expansion, the results schema, resume after a crash, multirun, wandb offline."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import ROOT, compose_config, run_cli
from omegaconf import open_dict

import mdmkit.evaluation.evaluate as evaluate_module
from mdmkit.analysis.aup import family_aup
from mdmkit.analysis.pareto import derive_family
from mdmkit.core.errors import ConfigError
from mdmkit.evaluation.evaluate import run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.evaluation.sweep import expand
from mdmkit.io.results import read_records

GRID = {"name": "mini", "entries": [
    {"sampler": "topk", "grid": {"k": [1, 8]}},
    {"sampler": "eb", "grid": {"gamma": [0.1]}},
    {"sampler": "topk", "grid": {"k": [1]}, "oracle": True},  # the same Top-1 again, now with its floor
]}


def evaluate(checkpoint: Path, results: Path, *overrides: str, sweep: dict | None = None, output_dir=None):
    cfg = compose_config("evaluate", [f"ckpt={checkpoint}", "limit=6", f"results_file={results}",
                                      "wandb.mode=disabled", *overrides])
    if sweep is not None:
        with open_dict(cfg):
            cfg.sweep = sweep
    return run_evaluation(plan_evaluation(cfg), output_dir)


def test_grid_expands_to_the_product_and_merges_repeats() -> None:
    jobs = expand({"entries": [{"sampler": "eb", "grid": {"gamma": [0.1, 1.0], "ordering": ["entropy", "margin"]}},
                               *GRID["entries"]]})
    assert len(jobs) == 4 + 3
    assert {(j.sampler["gamma"], j.sampler["ordering"]) for j in jobs[:4]} == {
        (0.1, "entropy"), (0.1, "margin"), (1.0, "entropy"), (1.0, "margin")}
    top1 = [j for j in jobs if j.sampler["_target_"].endswith("TopKSampler") and j.sampler["k"] == 1]
    assert len(top1) == 1 and top1[0].oracle


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"sampler": "nope"}, "sweep: sampler=nope: no such option \\(known: "),
        ({"sampler": "eb", "grid": {"gama": [0.1]}}, "sampler 'eb' has no field 'gama'"),
        ({"sampler": "eb", "grid": {"gamma": [0.1, -1.0]}}, r"sweep.entries\[0\]: gamma=-1.0 must be >= 0"),
        ({"sampler": "eb", "grids": {}}, "unknown key"),
        ({"grid": {"k": [1]}}, r"sweep.entries\[0\]: each entry needs a sampler"),
        ({"sampler": "topk", "grid": {"k": []}}, "an empty list in grid leaves no sampler"),
        ({"sampler": "topk", "oracle": "false"}, "oracle='false' must be true or false"),
    ],
)
def test_a_bad_sweep_entry_fails_before_anything_runs(entry: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand({"entries": [entry]})
    with pytest.raises(ConfigError, match="entries must be a non-empty list"):
        expand({"entries": {"sampler": "topk"}})


def test_rows_carry_the_full_schema_and_round_trip(tiny_checkpoint: Path, tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    (row,) = evaluate(tiny_checkpoint, results, "sampler=eb", "sampler.gamma=0.5")
    stored = read_records(results)
    assert stored == [json.loads(json.dumps(row))]
    assert row["family"] == "eb-confidence" and row["params"]["gamma"] == 0.5
    low, high = row["accuracy_ci95"]
    assert 0.0 <= low <= row["accuracy"] <= high <= 1.0
    assert row["tokens_per_step"] == pytest.approx(45 / row["nfe_mean"])  # 45 blanks per tiny-config puzzle
    assert row["nfe_to_stop_mean"] == row["nfe_mean"]  # no stop condition: the stop point is the end
    assert len(row["checkpoint_sha"]) == 16 and row["weights"] == "ema" and row["seed"] == 0
    assert row["versions"]["torch"] and "git_commit" in row
    assert row["tokens_per_s"] > 0 and row["nfe_median"] > 0


def test_a_sweep_killed_midway_resumes_without_losing_or_repeating_rows(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    results = tmp_path / "results.jsonl"
    real_run_job, calls = evaluate_module._run_job, []

    def crash_on_second(job, *args):
        calls.append(job)
        if len(calls) == 2:  # the machine went away mid-sweep: SIGTERM (a SLURM limit), handled as Ctrl-C is
            dict(handlers)[signal.SIGTERM](signal.SIGTERM, None)
        return real_run_job(job, *args)

    monkeypatch.setattr(evaluate_module, "_run_job", crash_on_second)
    handlers = []  # what the interrupted run does with a second Ctrl-C (recorded, not installed in pytest)
    monkeypatch.setattr(evaluate_module.signal, "signal", lambda *args: handlers.append(args))
    with pytest.raises(SystemExit) as interrupted:  # Ctrl-C: a summary on stderr, not a traceback
        evaluate(tiny_checkpoint, results, sweep=GRID)
    assert interrupted.value.code == 130 and (signal.SIGINT, signal.SIG_IGN) in handlers
    assert handlers[-1] == (signal.SIGTERM, None)  # the handler before the sweep put back (none in this stand-in)
    assert f"interrupted: 2 new row(s) saved to {results}; run the same command again" in capsys.readouterr().err
    assert len(read_records(results)) == 2  # Top-1 and its oracle floor were written
    with results.open("a") as handle:
        handle.write('{"kind": "evaluate", "acc')  # a torn line from the killed writer
    monkeypatch.setattr(evaluate_module, "_run_job", real_run_job)
    with pytest.warns(UserWarning, match="torn results line"):
        rows = evaluate(tiny_checkpoint, results, sweep=GRID)
    stored = read_records(results)
    capsys.readouterr()
    assert len(rows) == 4 and sorted(r["key"] for r in rows) == sorted(r["key"] for r in stored)
    assert len({r["key"] for r in stored}) == len(stored) == 4  # nothing run twice
    assert sorted(r["family"] for r in stored) == ["eb-confidence", "oracle", "topk-confidence", "topk-confidence"]
    again = evaluate(tiny_checkpoint, results, sweep=GRID)  # a finished sweep is all skipped, and says so
    assert len(read_records(results)) == 4 and len(again) == 4
    assert capsys.readouterr().out.count("already in") == 3


def test_sweep_logs_wandb_offline_and_plots_its_front(tiny_checkpoint: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must come from the config itself
    results = tmp_path / "results.jsonl"
    evaluate(tiny_checkpoint, results, "wandb.mode=offline", sweep=GRID, output_dir=tmp_path)
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    (aup_file,) = (tmp_path / "wandb").glob("offline-run-*/files/media/table/aup_by_family_*.table.json")
    logged = json.loads(aup_file.read_text())
    assert logged["columns"] == ["family", "aup"]
    assert logged["data"] == [[family, pytest.approx(value)] for family, value in
                              family_aup([r for r in read_records(results)], derive_family).items()]
    png = (tmp_path / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])
def test_multirun_over_two_values_writes_two_rows(tiny_checkpoint: Path, tmp_path: Path, launcher: str) -> None:
    results = tmp_path / "results.jsonl"
    out = run_cli("evaluate.py", "-m", f"hydra/launcher={launcher}", f"ckpt={tiny_checkpoint}", "sampler.k=1,4",
                  "limit=4", "wandb.mode=disabled", f"results_file={results}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(r["params"]["k"] for r in read_records(results)) == [1, 4]


def test_the_slurm_launcher_config_composes() -> None:
    from hydra import compose, initialize_config_module

    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        cfg = compose("evaluate", ["ckpt=x.pt", "hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.gpus_per_node == 1


def test_sampler_overrides_beside_a_sweep_are_refused_not_ignored(tmp_path: Path) -> None:
    out = run_cli("evaluate.py", f"ckpt={ROOT}/checkpoints/sudoku_mdm.pt", "sweep=sudoku_fronts", "sampler.k=7",
                  "oracle=true", f"results_file={tmp_path}/rows.jsonl", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: sweep=sudoku_fronts sets the samplers and oracle of each row; sampler.k=7 oracle=true would be "
        "ignored: drop it, or add it to the sweep's grid")


def test_equal_settings_written_differently_are_one_row(tiny_checkpoint: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """`sampler.gamma=1` from a command line and `gamma: 1.0` from a grid are one setting: one row, resumed."""
    assert len(expand({"entries": [{"sampler": "eb", "grid": {"gamma": [1, 1.0]}}]})) == 1
    results = tmp_path / "results.jsonl"
    (first,) = evaluate(tiny_checkpoint, results, "sampler=eb", "sampler.gamma=1")
    capsys.readouterr()
    grid = {"name": "one", "entries": [{"sampler": "eb", "grid": {"gamma": [1.0]}}]}
    (again,) = evaluate(tiny_checkpoint, results, sweep=grid)
    assert "already in" in capsys.readouterr().out
    assert read_records(results) == [again] and again["key"] == first["key"]


def test_asking_for_the_oracle_of_a_recorded_sampler_adds_only_the_oracle_row(
        tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "results.jsonl"
    first = evaluate(tiny_checkpoint, results, "sampler.k=2")
    capsys.readouterr()
    again = evaluate(tiny_checkpoint, results, "sampler.k=2", "oracle=true")
    assert "sampled again for its oracle floor (the row is kept, not written twice)" in capsys.readouterr().out
    stored = read_records(results)
    assert [r["kind"] for r in stored] == ["evaluate", "oracle"]  # the sampler's row is not written twice
    assert again[0] == stored[0] and again[0]["key"] == first[0]["key"] and again[1]["kind"] == "oracle"
    assert again[0]["test_set"] == again[1]["test_set"] == first[0]["test_set"]  # the same examples

"""Small training traps: a relative run directory for the report, max_steps=0, range errors that wait for
Lightning to import, promotional lines on every job."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, compose_config, load_script, run_cli, run_cli_cases

from mdmkit.core.errors import ConfigError
from mdmkit.training.preflight import plan_training
from mdmkit.training.train import run_training

FAST = [*TINY, "trainer.val_check_interval=100"]


def test_training_report_takes_a_relative_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_config("train", [*FAST, "trainer.max_steps=2", "trainer.log_every_n_steps=1", "eval_limit=4",
                                   f"results_file={tmp_path}/results.jsonl"])
    run_training(plan_training(cfg), tmp_path / "run")
    report = load_script("training_report")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("**What the curve shows.**\n")
    argv = ["run", "--name", "tiny", "--command", "train.py", "--results-file", "results.jsonl", "--out", "pages",
            "--notes", "notes.md"]
    monkeypatch.setattr(sys, "argv", ["training_report.py", *argv])
    report.main()  # was: SystemExit("no train record for run/model.pt ...")
    page = (tmp_path / "pages/tiny.md").read_text()
    assert "**What the curve shows.**" in page  # the notes file's text, not its name
    assert "python scripts/training_report.py run --name tiny" in page  # the command that redraws the page


def test_training_report_joins_the_legs_of_a_chained_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/device/device_train.sh's layout: run/ then run/leg1 (warm restart), each leg's records in its directory."""
    run = tmp_path / "sudoku_run"
    calls = ((run, []), (run / "leg1", [f"init_from={run}/model.pt", "trainer.max_steps=4"]),
             # a second call goes on with leg1 where the first left it (its last.ckpt came back or stayed)
             (run / "leg1", [f"init_from={run}/model.pt", "trainer.max_steps=6",
                             f"ckpt_path={run}/leg1/checkpoints/last.ckpt"]))
    for leg, extra in calls:
        cfg = compose_config("train", [*FAST, "trainer.max_steps=2", "trainer.val_check_interval=2",
                                       "trainer.log_every_n_steps=1", "eval_limit=4",
                                       f"results_file={leg}/results.jsonl", *extra])
        run_training(plan_training(cfg), leg)
    report = load_script("training_report")
    # the first leg's record also in the results file (as after `cat run/results.jsonl >> report.jsonl`): one call
    (tmp_path / "report.jsonl").write_text((run / "results.jsonl").read_text())
    monkeypatch.setattr(sys, "argv", ["training_report.py", str(run), "--name", "chained", "--command", "legs",
                                      "--results-file", str(tmp_path / "report.jsonl"), "--out", str(tmp_path)])
    report.main()
    data = json.loads((tmp_path / "chained.json").read_text())
    assert data["steps"] == 2 + 6 and [leg["steps"] for leg in data["legs"]] == [2, 6]
    assert data["legs"][0]["started"] == "fresh" and data["legs"][1]["started"].startswith("warm restart from")
    assert [leg["calls"] for leg in data["legs"]] == [1, 2]
    recorded = [json.loads(line)["train_time_s"] for line in (run / "leg1" / "results.jsonl").read_text().splitlines()]
    called = [json.loads(line)["seconds"] for line in (run / "leg1" / "calls.jsonl").read_text().splitlines()]
    # one measure: each train record says the run's time over its calls so far, as calls.jsonl adds them up
    assert recorded == pytest.approx(list(itertools.accumulate(called)))
    assert data["legs"][1]["train_time_s"] == pytest.approx(sum(called))
    first, second = ([step for step, _ in report.read_metrics(leg)["val/accuracy"]] for leg in (run, run / "leg1"))
    assert len(second) == 3 and [step for step, _ in data["val_accuracy"]] == first + [2 + s for s in second]
    page = (tmp_path / "chained.md").read_text()
    assert "8 steps" in page and "in 2 legs" in page and "then resumed (2 calls)" in page
    assert all(leg["steps_per_s"] > 0 for leg in data["legs"]) and "| steps/s |" in page  # train/steps_per_s


def test_training_report_counts_calls_stopped_before_their_record_and_writes_beside_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run_training(plan_training(compose_config("train", [*FAST, "trainer.max_steps=2", "eval_limit=4",
                                                        f"results_file={run}/results.jsonl"])), run)
    with (run / "calls.jsonl").open("a") as calls:  # a call a time limit stopped: last.ckpt, but no train record
        calls.write(json.dumps({"seconds": 600.0, "global_step": 1}) + "\n")
    report = load_script("training_report")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["training_report.py", "run", "--name", "page", "--command", "train.py",
                                      "--results-file", "run/results.jsonl"])
    report.main()
    data = json.loads((run / "page.json").read_text())  # beside the run, not in the checkout's docs/results
    assert data["train_time_s"] > 600 and data["legs"][0]["calls"] == 2
    assert "`python evaluate.py ckpt=run/model.pt`" in (run / "page.md").read_text()  # a file that exists


def test_max_steps_zero_is_an_error_not_an_empty_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer: max_steps=0 must be an integer >= 1"):
        run_training(plan_training(compose_config("train", [*FAST, "trainer.max_steps=0"])), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


RANGE_ERRORS = {  # an override: the start of its one line
    "trainer.max_steps=0": "trainer: max_steps=0 must be an integer >= 1",
    "model.n_layers=0": "model: n_layers=0 must be >= 1",
    "optim.lr=0": "optim: lr=0 must be > 0",
    "sampler.k=0": "sampler: k=0 must be >= 1",
    "save_dtype=float16": "save_dtype=float16 must be one of float32, bfloat16",
    "compile=maybe": "compile=maybe must be true, false or a torch.compile mode (default, reduce-overhead",
    "data.workers=-1": "data: workers=-1 must be >= 0",
}


@pytest.fixture(scope="module")
def range_error_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """`python train.py <override>` for each range error, where any import of lightning fails loudly."""
    work = tmp_path_factory.mktemp("range-errors")
    fake = work / "fake" / "lightning"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('lightning was imported')\n")
    return run_cli_cases("train.py", {override: (work, [*TINY, override]) for override in RANGE_ERRORS},
                         env={"PYTHONPATH": str(fake.parent)})


@pytest.mark.parametrize("override", list(RANGE_ERRORS))
def test_range_errors_stop_before_lightning_is_imported(range_error_runs, override: str) -> None:
    out = range_error_runs[override]
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {RANGE_ERRORS[override]}"), \
        out.stderr


def test_a_job_prints_no_adverts_and_one_wandb_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_SHOW_INFO", raising=False)
    out = run_cli("train.py", *FAST, "logger=default", "trainer.max_steps=2", "evaluate_after_training=false",
                  f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout + out.stderr
    for advert in ("💡", "litlogger", "litmodels", "wandb leet", "W&B syncing is set", "Tracking run with wandb",
                   "anonymous setting", "Run summary"):
        assert advert not in printed, advert
    wandb_lines = [line for line in printed.splitlines() if line.startswith("wandb:")]
    assert len(wandb_lines) == 1 and "upload: wandb sync" in wandb_lines[0]


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.max_time=90", r"trainer: max_time=90 must be \"DD:HH:MM:SS\""),
    ("trainer.max_time='9:30'", r"trainer: max_time=9:30 must be \"DD:HH:MM:SS\""),
    ("optim.anneal_by=max_time", r"optim.anneal_by=max_time needs trainer.max_time"),
    ("optim.anneal_by=time", r"optim: anneal_by=time must be one of max_steps, max_time"),
    ("optim.anneal_time='00:00:10'", r"optim: anneal_time=00:00:10 must be null or a positive \"DD:HH:MM:SS\""),
    ("optim.anneal_time='00:00:00:00'", r"anneal_time=00:00:00:00 must be null or a positive"),
    ("optim.anneal_time='00:00:10:00'", r"optim: anneal_time is the time the decay spans: it needs anneal_by=max_time"),
])
def test_time_limit_and_anneal_by_mistakes_stop_before_training(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_training(plan_training(compose_config("train", [*FAST, override])), tmp_path)
    assert not (tmp_path / "checkpoints").exists()

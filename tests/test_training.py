"""Training end to end on tiny settings: fast_dev_run, exact resume, evaluate round trip, DDP, bad checkpoints."""

from __future__ import annotations

import csv
import json
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from conftest import TINY, WAIT_S, compose_config, run_cli

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.evaluation.evaluate import run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.training.module import MDMModule
from mdmkit.training.preflight import plan_training
from mdmkit.training.train import run_training


def train(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config("train", [*TINY, f"results_file={tmp_path}/results.jsonl", *overrides])
    return run_training(plan_training(cfg), tmp_path)


def test_fast_dev_run_trains_one_step_and_writes_a_model(tmp_path: Path) -> None:
    summary = train(tmp_path, "trainer.fast_dev_run=true")
    assert summary["global_step"] == 1
    assert TrainedModel(tmp_path / "model.pt").network().num_parameters() > 0


def test_bf16_model_file_and_a_time_limit(tmp_path: Path) -> None:
    """save_dtype=bfloat16 halves model.pt and loads back as the float32 network rounded to bf16; a run stopped by
    trainer.max_time still writes its model."""
    summary = train(tmp_path, "save_dtype=bfloat16", "trainer.max_steps=1000", "trainer.max_time='00:00:00:03'",
                    "evaluate_after_training=false")
    assert 0 < summary["global_step"] < 1000
    saved = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=False)["network"]
    assert {w.dtype for w in saved.values()} == {torch.bfloat16}
    live = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    network = TrainedModel(tmp_path / "model.pt").network()
    for name, weight in network.state_dict().items():
        assert weight.dtype == torch.float32
        assert torch.equal(weight, live["ema.shadow." + name.replace(".", "__")].to(torch.bfloat16).float())


def test_default_loggers_write_wandb_offline_and_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must come from the config itself
    monkeypatch.setenv("WANDB_API_KEY", "")
    train(tmp_path, "logger=default", "trainer.max_steps=2", "evaluate_after_training=false")
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert list((tmp_path / "csv").glob("version_*/metrics.csv"))


def test_logger_none_trains_and_writes_no_logs(tmp_path: Path) -> None:
    summary = train(tmp_path, "logger=none", "trainer.max_steps=2", "evaluate_after_training=false")
    assert summary["global_step"] == 2 and (tmp_path / "model.pt").is_file()
    assert not (tmp_path / "csv").exists() and not (tmp_path / "wandb").exists()


def test_training_then_evaluation_records_accuracy_and_counted_nfe(tmp_path: Path) -> None:
    summary = train(tmp_path)
    assert summary["global_step"] == 4
    assert summary["n"] == 40 and 0.0 <= summary["accuracy"] <= 1.0
    assert summary["nfe_mean"] == 81 - 36  # full-step: one forward pass per blank cell
    record = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert record["kind"] == "train" and record["config"]["model"]["n_layers"] == 2
    assert record["family"] == "topk-confidence"  # the row says which sampler made its number
    assert (tmp_path / "csv").is_dir()


def _weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {"optimizer": state["optimizer_states"][0]["state"][0]["exp_avg"], **state["state_dict"]}


def test_resume_continues_exactly_the_same_run(tmp_path: Path) -> None:
    straight, interrupted, resumed = tmp_path / "straight", tmp_path / "interrupted", tmp_path / "resumed"
    common = ["trainer.max_steps=6", "trainer.val_check_interval=3", "evaluate_after_training=false"]
    train(straight, *common)
    train(interrupted, *common, "checkpoint_every=3")
    midway = next((interrupted / "checkpoints").glob("step0000003.ckpt"))
    summary = train(resumed, *common, f"ckpt_path={midway}")
    assert summary["global_step"] == 6
    expected, actual = _weights(straight / "checkpoints/last.ckpt"), _weights(resumed / "checkpoints/last.ckpt")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name  # network, EMA and optimizer state alike


def test_batches_made_by_worker_processes_train_the_same_run(tmp_path: Path) -> None:
    """data.workers=2: the workers make alternate steps' batches (augmented by their own draws) and
    the loader takes them in turn, so a run made that way, and resumed half-way, ends where one made in the
    training process does."""
    alone, workers, resumed = tmp_path / "alone", tmp_path / "workers", tmp_path / "resumed"
    common = ["trainer.max_steps=6", "trainer.val_check_interval=3", "evaluate_after_training=false",
              "data.augment=true"]
    train(alone, *common)
    train(workers, *common, "data.workers=2", "checkpoint_every=3")
    midway = next((workers / "checkpoints").glob("step0000003.ckpt"))
    train(resumed, *common, "data.workers=2", f"ckpt_path={midway}")
    expected = _weights(alone / "checkpoints/last.ckpt")
    for run in (workers, resumed):
        actual = _weights(run / "checkpoints/last.ckpt")
        assert all(torch.equal(expected[name], actual[name]) for name in expected), run.name


def test_ctrl_c_keeps_the_step_reached_and_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    """Without `checkpoint_every`, last.ckpt is refreshed at each validation's step and written on Ctrl-C (or
    SIGTERM): an interrupted run resumes from where it stopped, to the uninterrupted run's exact state."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    common = ["trainer.max_steps=6", "trainer.val_check_interval=2", "evaluate_after_training=false"]
    train(straight, *common)
    seen = {}

    def stop_at_step_5(module, batch, batch_idx):
        if module.global_step == 5:
            last = torch.load(interrupted / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
            seen["periodic"] = last["global_step"]
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(MDMModule, "on_train_batch_start", stop_at_step_5, raising=False)
        with pytest.raises(SystemExit):
            train(interrupted, *common)
    assert seen["periodic"] == 4  # the validation at step 4 refreshed it
    assert torch.load(interrupted / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 5
    assert sorted(p.name for p in (interrupted / "checkpoints").iterdir()) == ["last.ckpt"]  # no step file
    assert (f"interrupted at step 5; last.ckpt holds step 5; resume with: python train.py ckpt_path={interrupted}"
            in capsys.readouterr().err)
    train(interrupted, *common, f"ckpt_path={interrupted}/checkpoints/last.ckpt")
    expected, actual = _weights(straight / "checkpoints/last.ckpt"), _weights(interrupted / "checkpoints/last.ckpt")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


TIME_BOXED = ["trainer.max_steps=100000", "trainer.max_time='00:00:00:02'", "trainer.val_check_interval=100000",
              "evaluate_after_training=false", "optim.warmup_steps=5"]


class TrainingClock:
    """The time Lightning's timer and mdmkit's callbacks read, passing only as training and validation run: a
    training step takes `step_s` and a validation after training began `validation_s`, whatever the machine's
    speed (so a 2-second limit is 20 steps here)."""

    def __init__(self, step_s: float = 0.1, validation_s: float = 0.0) -> None:
        self.now, self.step_s, self.validation_s = 1000.0, step_s, validation_s

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic


@pytest.fixture
def training_clock(monkeypatch: pytest.MonkeyPatch) -> TrainingClock:
    import lightning.pytorch.callbacks.timer as lightning_timer

    from mdmkit.training import callbacks

    clock = TrainingClock()
    monkeypatch.setattr(lightning_timer, "time", clock)
    monkeypatch.setattr(callbacks, "time", clock)
    training_step, validation_step = MDMModule.training_step, MDMModule.validation_step

    def timed_step(module: MDMModule, *args: object) -> object:
        clock.now += clock.step_s
        return training_step(module, *args)

    def timed_validation(module: MDMModule, *args: object) -> object:
        if module.trainer.global_step > 0:  # not the sanity check before training
            clock.now += clock.validation_s
        return validation_step(module, *args)

    monkeypatch.setattr(MDMModule, "training_step", timed_step)
    monkeypatch.setattr(MDMModule, "validation_step", timed_validation)
    return clock


@pytest.mark.usefixtures("training_clock")
def test_a_resumed_run_gets_its_time_limit_afresh(tmp_path: Path) -> None:
    """trainer.max_time limits each call: Lightning's timer carried the first call's time into the resumed one,
    which then stopped before its first step (a chain of time-boxed device calls never went on)."""
    first = train(tmp_path / "first", *TIME_BOXED)["global_step"]
    second = train(tmp_path / "second", *TIME_BOXED, f"ckpt_path={tmp_path}/first/checkpoints/last.ckpt")
    assert first == 20 and second["global_step"] == 40  # 2 s of 0.1-second steps in each call


def _last_lr(run: Path) -> list[float]:
    state = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    return [group["lr"] for group in state["optimizer_states"][0]["param_groups"]]


@pytest.mark.usefixtures("training_clock")
@pytest.mark.parametrize("anneal_by", ["max_steps", "max_time"])
def test_anneal_by_max_time_ends_the_decay_with_the_time_limit(tmp_path: Path, anneal_by: str) -> None:
    summary = train(tmp_path, *TIME_BOXED, f"optim.anneal_by={anneal_by}")
    assert summary["global_step"] == 20  # stopped by the time limit, far from max_steps
    for lr in _last_lr(tmp_path):  # lr 1e-3; min_lr_ratio 0.1
        if anneal_by == "max_time":
            assert 1e-4 <= lr < 1.1e-4  # the cosine at (nearly) its end when the time ran out
        else:
            assert lr > 0.99e-3  # the step count's cosine has barely begun


def _logged_lrs(run: Path) -> list[float]:
    with (run / "csv/version_0/metrics.csv").open() as handle:
        return [float(row["lr-AdamW/pg1"]) for row in csv.DictReader(handle) if row["lr-AdamW/pg1"]]


def test_anneal_time_spans_the_calls_of_a_resumed_run(tmp_path: Path, training_clock: TrainingClock) -> None:
    """optim.anneal_time: the decay spans the training time of all calls of a resumed run. The first of two
    2-second calls under a 4-second span stops about half-way down the cosine, and the resumed call goes on
    from there to its end (resumed without the span, a call starts again near the peak: the step count's
    cosine over 100k steps has barely begun). The validation Lightning runs after the time limit stopped
    training is not training time: made slow here, it must not count."""
    training_clock.validation_s = 1.0
    span = [*TIME_BOXED, "optim.anneal_by=max_time", "optim.anneal_time='00:00:00:04'", "trainer.log_every_n_steps=1"]
    train(tmp_path / "first", *span)
    first = torch.load(tmp_path / "first/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert first["callbacks"]["CallTimer"]["time_elapsed"]["train"] >= 3.0  # the slow validation ran
    assert 2.0 <= first["callbacks"]["AnnealByTime"]["seconds"] < 2.5
    (halfway,) = set(_last_lr(tmp_path / "first"))
    assert 3e-4 < halfway < 8e-4  # lr 1e-3, min_lr_ratio 0.1: 5.5e-4 half-way through the span

    train(tmp_path / "second", *span, f"ckpt_path={tmp_path}/first/checkpoints/last.ckpt")
    second = torch.load(tmp_path / "second/checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert second["callbacks"]["AnnealByTime"]["seconds"] >= 4.0
    resumed = _logged_lrs(tmp_path / "second")
    assert resumed[0] <= halfway * 1.05  # it goes on down, not back up
    assert all(later <= earlier for earlier, later in pairwise(resumed))
    for lr in _last_lr(tmp_path / "second"):
        assert 1e-4 <= lr < 1.1e-4  # the span is spent: the decay's end


@pytest.mark.parametrize("enabled, terminal", [(False, True), (True, False), (True, True)])
def test_the_loss_goes_to_the_progress_bar_only_where_one_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                enabled: bool, terminal: bool) -> None:
    """Lightning turns the progress bar's values into Python numbers after every step: on a GPU, a sync that stops
    the host queueing the next step. A run without a bar (disabled, or writing progress lines to a log file) must
    give it none."""
    seen: list[dict] = []
    monkeypatch.setattr(MDMModule, "on_train_end",
                        lambda module: seen.append(dict(module.trainer.progress_bar_metrics)))
    for where in ("mdmkit.training.train", "mdmkit.training.callbacks"):
        monkeypatch.setattr(f"{where}.on_terminal", lambda stream=None: terminal)
    train(tmp_path, f"trainer.enable_progress_bar={str(enabled).lower()}", "evaluate_after_training=false")
    assert ("train/loss" in seen[0]) is (enabled and terminal)


def test_the_logged_step_rate_times_training_and_leaves_validation_out(tmp_path: Path,
                                                                       training_clock: TrainingClock) -> None:
    """train/steps_per_s over windows of log_every_n_steps: each step here takes 0.1 s, so a window runs at 10
    steps/s; each 2-step window holds a validation of 1 s, which counted would put it at 1.7."""
    training_clock.validation_s = 1.0
    train(tmp_path, "trainer.max_steps=8", "trainer.log_every_n_steps=2", "evaluate_after_training=false")
    with (tmp_path / "csv/version_0/metrics.csv").open() as handle:
        rates = {int(row["step"]): float(row["train/steps_per_s"])
                 for row in csv.DictReader(handle) if row["train/steps_per_s"]}
    assert sorted(rates) == [2, 4, 6]  # a window ends where the next step starts: none after the last
    assert rates == pytest.approx({2: 10.0, 4: 10.0, 6: 10.0}), rates


def test_evaluate_cli_round_trip_on_both_checkpoint_kinds(tmp_path: Path) -> None:
    train(tmp_path, "evaluate_after_training=false")
    results = tmp_path / "eval.jsonl"
    for ckpt in (tmp_path / "model.pt", tmp_path / "checkpoints/last.ckpt"):
        out = run_cli("evaluate.py", f"ckpt={ckpt}", "sampler.k=4", "limit=16", f"results_file={results}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "[sudoku] topk-confidence k=4: accuracy" in out.stdout and "NFE mean 12.00" in out.stdout  # ceil(45/4)
    slim, full = (json.loads(line) for line in results.read_text().splitlines())
    assert slim["accuracy"] == full["accuracy"] and slim["nfe"] == full["nfe"]  # both hold the EMA weights
    assert slim["sampler"]["k"] == 4 and slim["train_config"]["model"]["d_model"] == 32
    assert slim["nfe"]["histogram"] == {"12": 16}


@pytest.mark.parametrize("sampler", ["eb", "threshold", "factor", "steps", "p2"])
def test_every_sampler_runs_from_evaluate_with_its_oracle_floor(tmp_path: Path, sampler: str) -> None:
    train(tmp_path, "trainer.fast_dev_run=true")
    results = tmp_path / "eval.jsonl"
    cfg = compose_config("evaluate", [f"ckpt={tmp_path}/model.pt", f"sampler={sampler}", "limit=8", "oracle=true",
                                      f"results_file={results}"])
    run_evaluation(plan_evaluation(cfg))
    measured, floor = (json.loads(line) for line in results.read_text().splitlines())
    assert measured["kind"] == "evaluate" and measured["n"] == 8
    assert floor["kind"] == "oracle" and floor["sampler"]["reference"]["_target_"] == cfg.sampler._target_
    assert floor["accuracy"] == measured["accuracy"]  # the floor reproduces the same outputs
    assert 1 <= floor["nfe_mean"] <= measured["nfe_mean"]


def test_missing_and_incompatible_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    out = run_cli("evaluate.py", f"ckpt={tmp_path}/nope.pt", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == f"error: checkpoint not found: {tmp_path}/nope.pt"
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        TrainedModel(junk)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="list.pt: not an mdmkit checkpoint \\(a saved list, not a dict\\)"):
        TrainedModel(tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="is a directory: name a checkpoint file"):
        TrainedModel(tmp_path)
    train(tmp_path, "trainer.fast_dev_run=true")
    out = run_cli("evaluate.py", f"ckpt={tmp_path}/model.pt", "task=maze", cwd=tmp_path)
    assert out.returncode == 2
    assert "was trained on task 'sudoku' (vocab 11, length 89); task 'maze' needs vocab 19, length 50" in out.stderr
    out = run_cli("train.py", *TINY, f"ckpt_path={tmp_path}/missing.ckpt", cwd=tmp_path)
    assert out.returncode == 2 and "error: ckpt_path not found" in out.stderr


def test_a_bad_evaluation_sampler_stops_training_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sampler: k=0 must be >= 1"):
        train(tmp_path, "sampler.k=0")
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])  # jobs in this process, or in worker processes
def test_a_bad_job_does_not_stop_a_sweep(tmp_path: Path, launcher: str) -> None:
    train(tmp_path, "trainer.fast_dev_run=true")
    results = tmp_path / "sweep.jsonl"
    out = run_cli("evaluate.py", "-m", f"ckpt={tmp_path}/model.pt", "sampler.k=0,45", "limit=4,abc",
                  f"results_file={results}", f"hydra/launcher={launcher}", cwd=tmp_path)
    assert "error: sampler: k=0 must be >= 1" in out.stderr
    assert "NFE mean 1.00" in out.stdout  # the k=45 job ran: one pass reveals all 45 blanks
    assert len(results.read_text().splitlines()) == 1
    # the sweep ran to its end, then says which jobs failed and exits with an error status
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "error: 3 of the sweep's 4 job(s) failed (the rows of the others are saved):" in out.stderr
    assert "(sampler.k=45 limit=4)" not in out.stderr and "(sampler.k=45 limit=abc): limit=abc must" in out.stderr
    notes = sorted(p.name for p in tmp_path.glob("multirun/evaluate/*/failed_jobs/*.json"))
    assert notes == ["0.json", "1.json", "3.json"]


def test_failed_jobs_are_listed_when_each_job_has_a_sweep_directory_of_its_own(tmp_path: Path) -> None:
    """`train.yaml`'s sweep directory holds run_name, so the jobs of `run_name=a,b` write under different ones."""
    out = run_cli("train.py", "-m", "run_name=a,b", "model.n_layers=0", cwd=tmp_path)
    assert out.returncode == 2 and "error: 2 of the sweep's 2 job(s) failed:\n" in out.stderr, out.stderr[-2000:]
    assert "job 0 (run_name=a): model: n_layers=0 must be >= 1" in out.stderr
    assert "job 1 (run_name=b): model: n_layers=0 must be >= 1" in out.stderr


def test_ddp_with_two_cpu_processes(tmp_path: Path) -> None:
    out = run_cli("train.py", *TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                  f"results_file={tmp_path}/r.jsonl", cwd=tmp_path, timeout=WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[sudoku] trained 4 steps" in out.stdout
    assert "| topk-confidence k=1: accuracy" in out.stdout  # the evaluation names its sampler and settings

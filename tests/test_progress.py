"""Progress in a log file: plain lines at an interval (and at the end), never a bar's carriage returns; a long
batch shows its forward passes."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY, compose_config

import mdmkit.core.progress as progress_module
from mdmkit.core.progress import ForwardTicks, progress_bar
from mdmkit.training.callbacks import ProgressLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bar_in_a_log_file_writes_lines_at_its_interval_and_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()  # not a terminal
    with progress_bar(total=4, desc="sampling", file=log) as bar:
        for _ in range(4):
            bar.update(1)  # within the interval: no line
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2  # the start and the end, each a line of its own
    assert lines[0].startswith("sampling:   0%") and lines[1].startswith("sampling: 100%") and "4/4" in lines[1]
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    log = io.StringIO()
    with progress_bar(total=1, desc="sampling", file=log) as bar:
        ticks = ForwardTicks(bar)
        for _ in range(3):
            ticks()  # one batch, three forwards: the bar moves within it
        bar.update(1)
    assert [line.split("it/s, ")[-1].rstrip("]") for line in log.getvalue().splitlines()[1:4]] == [
        "1 forwards", "2 forwards", "3 forwards"]


def test_training_progress_lines_give_step_loss_rate_and_time_left(capsys: pytest.CaptureFixture) -> None:
    clock = Clock()
    lines = ProgressLines(every_s=30.0, clock=clock)
    trainer = SimpleNamespace(global_step=100, max_steps=1100, is_global_zero=True,
                              callback_metrics={"train/loss": 1.23456})  # a run resumed at step 100
    lines.on_train_start(trainer)
    for step in range(101, 160):
        trainer.global_step, clock.now = step, clock.now + 1.0
        lines.on_train_batch_end(trainer)
    assert capsys.readouterr().out.splitlines() == [
        "step 130/1100 | loss 1.2346 | 1.00 steps/s | 0:16:10 left"]  # one line per 30 s, from the resumed step
    lines.on_train_end(trainer)
    assert capsys.readouterr().out == "step 159/1100 | loss 1.2346 | 1.00 steps/s | 0:15:41 left\n"
    trainer.is_global_zero = False
    lines.on_train_end(trainer)
    assert capsys.readouterr().out == ""  # one process prints


def test_each_validation_writes_a_line_with_its_loss(capsys: pytest.CaptureFixture) -> None:
    clock = Clock()
    lines = ProgressLines(every_s=30.0, clock=clock)
    trainer = SimpleNamespace(global_step=0, max_steps=400, is_global_zero=True, sanity_checking=False,
                              callback_metrics={"train/loss": 2.5})
    lines.on_train_start(trainer)
    trainer.global_step, clock.now = 200, 100.0
    trainer.callback_metrics["val/loss"] = 1.87654
    lines.on_validation_end(trainer)
    assert capsys.readouterr().out == "step 200/400 | loss 2.5000 | val loss 1.8765 | 2.00 steps/s | 0:01:40 left\n"
    trainer.global_step, clock.now = 230, 130.0  # the next periodic line keeps the last validation's loss
    lines.on_train_batch_end(trainer)
    assert "| val loss 1.8765 |" in capsys.readouterr().out


def test_training_and_sampling_write_progress_lines_when_the_output_is_a_file(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    from mdmkit.training.preflight import plan_training
    from mdmkit.training.train import run_training

    cfg = compose_config("train", [*TINY, "trainer.max_steps=3", "trainer.enable_progress_bar=true",
                                   f"results_file={tmp_path}/rows.jsonl"])
    run_training(plan_training(cfg), tmp_path)
    captured = capsys.readouterr()  # pytest's capture: not a terminal, as under nohup or SLURM
    assert "step 3/3 | loss " in captured.out and "\r" not in captured.out
    assert "sampling: 100%" in captured.err and "forwards]" in captured.err and "\r" not in captured.err


def test_a_run_says_what_it_will_make_and_evaluate_before_it_starts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.tasks.sudoku import SudokuTask
    from mdmkit.training.run_config import DataConfig, RunConfig
    from mdmkit.training.train import costs

    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))
    task = SudokuTask(n_train=100_000, n_val=1_000, n_test=1_000, cache_dir=str(tmp_path))
    lines = costs(task, RunConfig(), DataConfig(batch_size=64), 200, "topk-confidence k=1")
    assert lines == [
        (f"data: making 102,000 sudoku examples (train 100,000, val 1,000, test 1,000) once, cached in "
        f"{task.cache_path()}; 200 steps x 64 read 12,800 training examples per process (task.n_train=12800 makes "
        "no more)"),
        ("after training: topk-confidence k=1 on 1,000 test examples (eval_limit=N for fewer, "
        "evaluate_after_training=false for none)")]
    task.cache_path().write_bytes(b"")  # made before: nothing to say about data
    assert costs(task, RunConfig(eval_limit=100), DataConfig(), 200, "eb")[0].startswith("after training: eb on 100 ")
    assert costs(task, RunConfig(evaluate_after_training=False), DataConfig(), 200, "eb") == []

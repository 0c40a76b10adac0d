"""Evaluation traps (issue 18): evaluation makes only the test split, multirun directories hold their rows,
a missing device is one line, `task=` keeps the checkpoint's task settings, and --help is mdmkit's own."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, WAIT_S, compose_config, run_cli

import mdmkit.evaluation.evaluate as evaluate_module
from mdmkit.cli.overrides import task_fields
from mdmkit.core.config import to_container
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import CheckpointError, ConfigError, DataFormatError
from mdmkit.evaluation.distributed import Ranks
from mdmkit.evaluation.evaluate import run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.evaluation.sweep import SweepJob
from mdmkit.io.checkpoint import TrainedModel, build_network, build_task, save_slim
from mdmkit.io.results import read_records, row_key
from mdmkit.tasks.arithmetic import ArithmeticTask
from mdmkit.tasks.base import PuzzleTask
from mdmkit.tasks.maze import MazeTask
from mdmkit.tasks.sudoku import CELL_POSITIONS, SudokuTask

SUDOKU_CKPT = ROOT / "checkpoints" / "sudoku_mdm.pt"
# Measured before evaluation made the test split alone (which generated all 102,000 puzzles first): the row key of
# `evaluate.py ckpt=checkpoints/sudoku_mdm.pt limit=100` and a digest of the 100 test puzzles' keys it sampled.
# Keys then hashed the whole sampler dict (cache fields left out without a cache; mask_in_softmax did not exist).
KEY_LIMIT_100 = "c57b7bbe6bcb9581df53"
TEST_100_DIGEST = "24c77a92e1578ae6020e6b93d4ea0bb682549bb6"
MAZE_CELLS = ["model=tiny", "task=maze", "task.answer=cells", "task.min_path_len=3", "task.n_train=300",
              "task.n_val=40", "task.n_test=40"]


def untrained(path: Path, overrides: list[str]) -> Path:
    """A slim checkpoint of an untrained network: the config and weights evaluation loads, in a second."""
    config = to_container(compose_config("train", overrides))
    save_slim(config, build_network(config, build_task(config)).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def maze_cells(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untrained(tmp_path_factory.mktemp("maze-cells") / "model.pt", MAZE_CELLS)


@pytest.fixture(scope="module")
def tiny_sudoku(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untrained(tmp_path_factory.mktemp("tiny-sudoku") / "model.pt", TINY)


def no_full_generation(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fail on any generation of train + val + test; returns the counts `generate` is called with."""
    counts: list[int] = []
    original = SudokuTask.generate

    def generate(self: SudokuTask, count: int, seed: int):
        counts.append(count)
        return original(self, count, seed)

    def full(self: PuzzleTask, total: int):
        raise AssertionError(f"the training split was generated ({total} examples)")

    monkeypatch.setattr(SudokuTask, "generate", generate)
    monkeypatch.setattr(PuzzleTask, "_generate_unique", full)
    return counts


# -- item 2: evaluation makes only what it uses -------------------------------------------------------------------


def test_evaluation_makes_only_the_test_split_and_keeps_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: all would be generated
    counts = no_full_generation(monkeypatch)
    cfg = compose_config("evaluate", [f"ckpt={SUDOKU_CKPT}", "limit=100", "wandb.mode=disabled"])
    sampled = {}

    class Sampled(Exception):
        pass

    def sample_split(network, task, split, *args, **kwargs):
        sampled["split"] = split
        raise Sampled

    monkeypatch.setattr(evaluate_module, "sample_split", sample_split)
    _, rows, measure = evaluate_module._puzzle_setup(plan_evaluation(cfg), Ranks())
    sampler = to_container(cfg.sampler)
    sampler_then = {k: v for k, v in sampler.items() if k not in ("cache", "cache_refresh", "mask_in_softmax")}
    assert row_key(kind="evaluate", sampler=sampler_then, **rows.measurement) == KEY_LIMIT_100  # the same data
    with pytest.raises(Sampled):
        measure(SweepJob(sampler, False))
    assert hashlib.sha1(b"".join(sampled["split"].keys.tolist())).hexdigest() == TEST_100_DIGEST
    assert counts == [1000]  # the test split, once (was: 102,000 puzzles)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [TrainedModel(SUDOKU_CKPT).task.test_cache_path().name]


@pytest.mark.parametrize("make", [
    lambda cache: SudokuTask(n_train=300, n_val=40, n_test=40, workers=1, cache_dir=cache),
    lambda cache: MazeTask(grid_size=2, n_train=20, n_val=5, n_test=10, cache_dir=cache),  # many repeats: dedup
    lambda cache: MazeTask(grid_size=3, answer="cells", n_train=200, n_val=20, n_test=30, cache_dir=cache),
    lambda cache: ArithmeticTask(n_ops=2, n_train=200, n_val=20, n_test=30, cache_dir=cache),  # all three, cached
], ids=["sudoku", "maze2", "maze3-cells", "arithmetic"])
def test_the_test_split_alone_is_the_test_split_of_all_three(tmp_path: Path, make) -> None:
    full = make(str(tmp_path / "full")).load_splits()["test"]
    fresh = make(str(tmp_path / "alone"))
    alone = fresh.load_test()
    assert (alone.keys == full.keys).all() and torch.equal(alone.tokens, full.tokens)
    assert torch.equal(alone.answer_mask, full.answer_mask)
    assert fresh.cache_path().exists() != fresh.stable_prefix  # only arithmetic made (and cached) train and val
    again = make(str(tmp_path / "alone")).load_test()  # from the cache
    assert (again.keys == full.keys).all()


def test_a_malformed_test_file_fails_before_anything_is_generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.txt"
    bad.write_text("12345\n")
    no_full_generation(monkeypatch)
    monkeypatch.setattr(SudokuTask, "generate", lambda *a: pytest.fail("generated before reading test_file"))
    task = SudokuTask(test_file=str(bad), cache_dir=str(tmp_path / "cache"))
    for load in (task.load_test, task.load_splits):  # training reads it first too
        with pytest.raises(DataFormatError, match="bad.txt:1: expected 81 characters"):
            load()
    cfg = compose_config("evaluate", [f"ckpt={SUDOKU_CKPT}", "task=sudoku", f"task.test_file={bad}",
                                      f"results_file={tmp_path}/r.jsonl", "wandb.mode=disabled"])
    with pytest.raises(DataFormatError, match="expected 81 characters"):
        run_evaluation(plan_evaluation(cfg, task_fields={"test_file"}))


def test_a_test_file_of_cached_training_puzzles_is_refused(tmp_path: Path) -> None:
    task = SudokuTask(n_train=300, n_val=40, n_test=40, workers=1, cache_dir=str(tmp_path))
    train = task.load_splits()["train"]
    digits = np.where(train.answer_mask[0].numpy(), -1, train.tokens[0].numpy())[CELL_POSITIONS] + 1
    (tmp_path / "leak.txt").write_text("".join(map(str, digits)) + "\n")
    leaky = SudokuTask(n_train=300, n_val=40, n_test=40, workers=1, cache_dir=str(tmp_path),
                       test_file=str(tmp_path / "leak.txt"))
    with pytest.raises(DataFormatError, match="both the train/val and test splits"):
        leaky.load_test()


# -- item 6: multirun directories, devices, task=, --help ----------------------------------------------------------


def pareto_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/pareto.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=WAIT_S, check=False)


def test_pareto_finds_the_rows_of_a_multirun_directory(tiny_sudoku: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "evaluate" / "2026-01-01_00-00-00"
    done = run_cli("evaluate.py", "-m", f"ckpt={tiny_sudoku}", "sampler.k=1,4", "limit=4", "wandb.mode=disabled",
                   "results_file=results/evaluations.jsonl", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    saved = sorted(sweep.glob("*/rows.jsonl"))
    assert [p.parent.name for p in saved] == ["0", "1"]
    assert [read_records(file)[0]["params"]["k"] for file in saved] == [1, 4]
    out = tmp_path / "page"
    found = pareto_script(str(tmp_path / "multirun"), "--task", "sudoku", "--out", str(out))
    assert found.returncode == 0, found.stderr  # was: "no evaluate or oracle rows in multirun/"
    assert len((tmp_path / "page.jsonl").read_text().splitlines()) == 2

    for file in saved:  # a multirun made before jobs saved their rows: its multirun.yaml names the results file
        file.unlink()
    found = pareto_script(str(tmp_path / "multirun"), "--task", "sudoku", "--out", str(out))
    assert found.returncode == 0, found.stderr
    assert f"reading its results_file {tmp_path / 'results/evaluations.jsonl'}" in found.stderr
    assert len((tmp_path / "page.jsonl").read_text().splitlines()) == 2


def test_a_device_this_machine_lacks_is_one_line(tiny_sudoku: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device=cuda, but .*: use device=auto .* or device=cpu"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="device=gpu0 is not a device"):
        resolve_device("gpu0")
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device("auto") == torch.device("cpu")
    monkeypatch.undo()

    evaluated = run_cli("evaluate.py", f"ckpt={tiny_sudoku}", "device=cuda:99", "wandb.mode=disabled", cwd=tmp_path)
    fake = tmp_path / "fake" / "lightning"  # training must stop before Lightning is imported, not after training
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('lightning was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    trained = run_cli("train.py", *TINY, "device=cuda:99", cwd=tmp_path)
    for out in (evaluated, trained):  # was: a 26-line traceback from the first .to(device)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: device=cuda:99, but "), \
            out.stderr


def test_task_option_keeps_the_checkpoints_settings_unless_set_by_name(maze_cells: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    assert task_fields(["task=maze", "task.answer=path", "+task.workers=2", "~task.test_file", "ckpt=a.pt",
                        "sampler.k=2"]) == {"answer", "workers", "test_file"}
    trained = TrainedModel(maze_cells)
    given = to_container(compose_config("evaluate", ["task=maze", "ckpt=x"]).task)
    task, kept = trained.task_for(given, set())
    assert (task.answer, task.min_path_len, task.n_train) == ("cells", 3, 300)
    kept_line = "n_train=300, n_val=40, n_test=40, min_path_len=3, answer=cells"  # in the fields' order
    assert kept == kept_line.split(", ")
    task, _ = trained.task_for(given, {"min_path_len"})
    assert (task.answer, task.min_path_len) == ("cells", 2)
    assert trained.task_for(given, None)[0].answer == "path"  # None: the config as given (Python callers)

    results = tmp_path / "results.jsonl"
    base = [f"ckpt={maze_cells}", "limit=4", f"results_file={results}", "wandb.mode=disabled"]
    (own,) = run_evaluation(plan_evaluation(compose_config("evaluate", base)))
    (named,) = run_evaluation(plan_evaluation(compose_config("evaluate", [*base, "task=maze"]), task_fields=set()))
    assert named["key"] == own["key"]  # the same task, data and row (was: answer=path, another vocabulary)
    assert f"kept from the checkpoint: {kept_line}" in capsys.readouterr().out
    with pytest.raises(CheckpointError, match="needs vocab"):  # the override wins (and cannot fit this network)
        run_evaluation(plan_evaluation(compose_config("evaluate", [*base, "task=maze", "task.answer=path"]),
                                       task_fields={"answer"}))

    done = run_cli("evaluate.py", *base, "task=maze", "resume=false", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"[maze] kept from the checkpoint: {kept_line}" in done.stdout
    assert read_records(results)[-1]["key"] == own["key"]


def test_a_task_field_without_task_names_the_task_to_give(tmp_path: Path) -> None:
    """`evaluate.py ckpt=... task.n_givens=30`: Hydra alone refused with `Key 'task' is not in struct` and suggested
    `+task.n_givens=30`, which builds no task."""
    for field in ("task.n_givens=[24,26]", "+task.n_givens=30"):
        out = run_cli("evaluate.py", "ckpt=missing.pt", field, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert "no task=NAME is given" in lines[0] and f"task=sudoku {field.lstrip('+')} " in lines[0]
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a run directory


@pytest.mark.parametrize("script, present, absent", [
    ("evaluate.py", ["evaluate.py: sample the test split", "ckpt=PATH", "sampler=topk", "sweep=null", "topk, window",
                     "python evaluate.py ckpt=checkpoints/sudoku_mdm.pt limit=100"],
     ["powered by Hydra", "experiment", "trainer", "objective", "== Config =="]),
    ("train.py", ["train.py: train a masked diffusion model", "experiment=quickstart", "trainer=cpu", "sudoku_mdm",
                  "python train.py experiment=sudoku_mdm", "full_step, threshold"],
     ["powered by Hydra", "sweep=", "hf.kind", "== Config =="]),
])
def test_help_is_mdmkits_own(tmp_path: Path, script: str, present: list[str], absent: list[str]) -> None:
    done = run_cli(script, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    flowing = " ".join(done.stdout.split())  # option lists wrap at the help's width
    for text in present:
        assert text in flowing, text
    for text in absent:
        assert text not in done.stdout, text
    assert max(map(len, done.stdout.splitlines())) <= 120


def test_a_sampler_that_reads_the_logits_otherwise_than_they_were_trained_is_refused(tmp_path) -> None:
    """NTP-trained logits predict the next position, MDM logits their own: crossing them gave silent garbage."""
    from mdmkit.core.errors import CapabilityError
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation
    from mdmkit.training.preflight import plan_training
    from mdmkit.training.train import run_training

    cfg = compose_config("evaluate", [f"ckpt={ROOT}/checkpoints/arithmetic_mdm.pt", "sampler=ntp", "limit=4",
                                      f"results_file={tmp_path}/rows.jsonl", "wandb.mode=disabled"])
    with pytest.raises(CapabilityError, match="trained as a masked diffusion model: sampler NTPDecoder"):
        run_evaluation(plan_evaluation(cfg), tmp_path)
    with pytest.raises(CapabilityError, match="trained for next-token prediction .*not TopKSampler"):
        run_training(plan_training(compose_config("train", [*TINY, "objective=ntp", "sampler=topk"])), tmp_path / "run")

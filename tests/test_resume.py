"""Resume by run directory: the run's saved config with today's overrides on top, in the same directory and wandb
run, logged at the right steps; architecture mismatches (resume or init_from) are one line naming the fields."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import TINY, compose_config, run_cli
from omegaconf import OmegaConf

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.training.datamodule import step_indexed_loader
from mdmkit.training.optim import OptimConfig
from mdmkit.training.preflight import plan_training
from mdmkit.training.resume import ResumePlan, plan_resume, wandb_run_id
from mdmkit.training.train import run_training

FAST = [*TINY, "trainer.val_check_interval=100", "evaluate_after_training=false", "trainer.log_every_n_steps=1"]


def _train(path: Path, *overrides: str) -> dict:
    cfg = compose_config("train", [*FAST, f"results_file={path}/results.jsonl", *overrides])
    return run_training(plan_training(cfg), path)


def _steps(metrics: Path, column: str) -> list[int]:
    with metrics.open() as handle:
        return [int(row["step"]) for row in csv.DictReader(handle) if row.get(column)]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step run made by train.py (so with its .hydra/), wandb offline and CSV; copied by each test."""
    root = tmp_path_factory.mktemp("trained")
    out = run_cli("train.py", *FAST, "logger=default", "trainer.max_steps=4", f"results_file={root}/results.jsonl",
                  f"hydra.run.dir={root}/run", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run"


def test_resume_by_run_directory_goes_on_with_the_saved_config(trained_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    first_id = wandb_run_id(run)
    # no original override retyped (model=tiny, task sizes, logger...): they come from the run's saved config
    out = run_cli("train.py", "ckpt_path=run/checkpoints/last.ckpt", "trainer.max_steps=6",
                  "trainer.enable_progress_bar=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming {run} from checkpoints/last.ckpt with its saved config; changed: " \
           "trainer.enable_progress_bar: false -> true, trainer.max_steps: 4 -> 6" in out.stdout
    assert not (tmp_path / "outputs").exists()  # the same directory, not a new one
    config = OmegaConf.load(run / ".hydra/config.yaml")
    assert config.trainer.max_steps == 6 and config.model.d_model == 32 and config.task.n_train == 300
    assert OmegaConf.load(run / ".hydra/history/1/config.yaml").trainer.max_steps == 4
    assert "trainer.max_steps=6" in OmegaConf.load(run / ".hydra/overrides.yaml")
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 6
    # the same wandb run, and progress counts steps (it showed `Epoch 0/-2`): lines, in this log
    assert len(list((run / "wandb").glob("offline-run-*"))) == 2 and wandb_run_id(run) == first_id
    assert "step 6/6 | loss " in out.stdout and "/-2" not in out.stdout
    # the run directory itself resumes too: with nothing left to train, one line
    out = run_cli("train.py", f"ckpt_path={run}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: ckpt_path={run}/checkpoints/last.ckpt is at step 6 and trainer.max_steps=6: raise "
        "trainer.max_steps (e.g. trainer.max_steps=12) to train further")


def test_an_architecture_override_on_resume_is_one_line_and_leaves_the_run_alone(trained_run: Path,
                                                                                  tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    saved = {p.name: p.read_text() for p in (run / ".hydra").glob("*.yaml")}
    out = run_cli("train.py", f"ckpt_path={run}", "trainer.max_steps=6", "model.d_model=64", "model.n_heads=4",
                  cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"error: ckpt_path={run}/checkpoints/last.ckpt holds another architecture than "
                                  "this run's config: model.d_model=32 (this run: 64), model.n_heads=2 (this run: 4)")
    assert {p.name: p.read_text() for p in (run / ".hydra").glob("*.yaml")} == saved
    assert not (run / ".hydra/history").exists()


def test_a_resumed_run_logs_each_step_at_its_own_step(tmp_path: Path) -> None:
    # the last checkpoint saved after a validation at the last step is the one Lightning resumed one step late
    _train(tmp_path, "trainer.max_steps=4", "trainer.val_check_interval=4")
    _train(tmp_path, "trainer.max_steps=6", "trainer.val_check_interval=4",
           f"ckpt_path={tmp_path}/checkpoints/last.ckpt")
    assert _steps(tmp_path / "csv/version_0/metrics.csv", "train/loss") == [0, 1, 2, 3]
    assert _steps(tmp_path / "csv/version_1/metrics.csv", "train/loss") == [4, 5]  # was [5, 6]
    assert _steps(tmp_path / "csv/version_1/metrics.csv", "lr-AdamW/pg1") == [4, 5]


def test_a_checkpoint_of_another_architecture_is_one_line(tmp_path: Path) -> None:
    _train(tmp_path / "small", "trainer.max_steps=2")
    with pytest.raises(CheckpointError) as error:
        _train(tmp_path / "wide", "trainer.max_steps=4", "model.d_model=64", "model.n_heads=4",
               f"ckpt_path={tmp_path}/small/checkpoints/last.ckpt")
    assert str(error.value).endswith("model.d_model=32 (this run: 64), model.n_heads=2 (this run: 4)")
    with pytest.raises(CheckpointError) as error:
        _train(tmp_path / "deep", "trainer.max_steps=2", "model.n_layers=3", f"init_from={tmp_path}/small/model.pt")
    assert str(error.value) == (f"init_from={tmp_path}/small/model.pt holds another architecture than this run's "
                                "config: model.n_layers=2 (this run: 3)")
    _train(tmp_path / "same", "trainer.max_steps=2", "optim.lr=0.01", f"init_from={tmp_path}/small/model.pt")


# -- the plan, without running anything ---------------------------------------------------------------------------
def _fake_run(path: Path, overrides: list[str], hydra: list[str] | None = None) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / "checkpoints").mkdir()
    (path / "checkpoints/last.ckpt").write_bytes(b"")
    config = compose_config("train", overrides)
    (path / ".hydra/config.yaml").write_text(OmegaConf.to_yaml(config))
    (path / ".hydra/overrides.yaml").write_text(yaml.safe_dump(overrides))
    node = {"hydra": {"overrides": {"hydra": [f"hydra.run.dir={path}", *(hydra or [])], "task": overrides}}}
    (path / ".hydra/hydra.yaml").write_text(yaml.safe_dump(node))
    return path


def test_the_plan_puts_todays_overrides_on_the_runs_own(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "a b", ["model=tiny", "trainer.max_steps=4", "seed=3"],
                    hydra=["hydra.searchpath=[file://x]"])
    plan = plan_resume([f"ckpt_path={run}/checkpoints/last.ckpt", "trainer.max_steps=8", "--cfg", "job"])
    assert plan is not None and plan.run_dir == run
    assert plan.argv == ["--cfg", "job", "model=tiny", "seed=3", "hydra.searchpath=[file://x]",
                         "trainer.max_steps=8", f"ckpt_path='{run}/checkpoints/last.ckpt'",
                         f"hydra.run.dir='{run}'", "hydra.output_subdir=null"]
    assert plan_resume([f"ckpt_path={run}", "-m"]) is None  # a sweep resumes nothing by directory
    assert plan_resume([f"ckpt_path={tmp_path}/elsewhere.ckpt"]) is None  # no run around it: today's config
    with pytest.raises(CheckpointError, match="not a run directory"):
        plan_resume([f"ckpt_path={tmp_path}"])
    with pytest.raises(ConfigError, match="max_steps=0 must be an integer >= 1"):
        _train(tmp_path / "zero", "trainer.max_steps=0")


def test_the_saved_config_wins_over_conf_files_edited_since(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run", ["model=tiny", "trainer.max_steps=4"])
    saved = OmegaConf.load(run / ".hydra/config.yaml")
    saved.optim.lr = 0.005  # as if conf/optim/adamw.yaml had said 0.005 when the run started
    (run / ".hydra/config.yaml").write_text(OmegaConf.to_yaml(saved))
    plan = plan_resume([f"ckpt_path={run}", "trainer.max_steps=8", "model=cpu"])
    assert isinstance(plan, ResumePlan)
    composed = compose_config("train", ["model=tiny", "trainer.max_steps=4", "trainer.max_steps=8", "model=cpu"])
    config = plan.config(composed, lambda overrides: compose_config("train", overrides))
    assert config.optim.lr == 0.005 and config.trainer.max_steps == 8
    assert config.model == compose_config("train", ["model=cpu"]).model  # a group switched whole
    assert "trainer.max_steps: 4 -> 8" in plan.changes and "model.d_model: 32 -> 128" in plan.changes
    assert plan.kept == ["optim.lr=0.005 (conf/ now gives 0.001)"]


def test_optimizer_overrides_on_resume_take_effect(tmp_path: Path) -> None:
    """The checkpoint holds the old run's learning rate, betas and weight decay in its optimizer state; the
    resume prints `optim.lr: 0.001 -> 0.01`, so training must go on at 0.01 (it used to keep 0.001 silently)."""
    schedule = ["optim.warmup_steps=1", "trainer.max_steps=4"]
    _train(tmp_path, *schedule)
    _train(tmp_path, *schedule[:1], "trainer.max_steps=8", f"ckpt_path={tmp_path}/checkpoints/last.ckpt",
           "optim.lr=0.01", "optim.weight_decay=0.3", "optim.betas=[0.8,0.9]")
    with (tmp_path / "csv" / "version_1" / "metrics.csv").open() as handle:
        logged = {int(row["step"]): float(row["lr-AdamW/pg1"]) for row in csv.DictReader(handle)
                  if row.get("lr-AdamW/pg1")}
    optim = OptimConfig(lr=0.01, warmup_steps=1)
    assert sorted(logged) == [4, 5, 6, 7]
    for step, lr in logged.items():
        assert lr == pytest.approx(0.01 * optim.lr_factor(step, 8))
    groups = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["optimizer_states"][0]
    assert [(g["weight_decay"], tuple(g["betas"])) for g in groups["param_groups"]] == [(0.3, (0.8, 0.9)),
                                                                                         (0.0, (0.8, 0.9))]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_training_loader_goes_on_at_the_step_reached_and_pins_batches_for_a_gpu(device: str) -> None:
    """A copy from pageable memory makes the host wait for the GPU's queue: a GPU's batches come pinned."""
    trainer = SimpleNamespace(global_step=3, accumulate_grad_batches=2, global_rank=0, world_size=1,
                              strategy=SimpleNamespace(root_device=torch.device(device)))
    loader = step_indexed_loader(trainer, (torch.arange(10),), 2, seed=0)
    assert loader.dataset.start_step == 6 and loader.pin_memory is (device == "cuda")


def test_a_run_resumed_after_a_crash_within_a_step_validates_on_its_steps(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint written by a crash (Ctrl-C, SIGTERM) during a step left Lightning's batch counter a batch ahead:
    the resumed run validated a step early (after steps 9 and 14 instead of 10 and 15)."""
    from lightning.pytorch.callbacks import Callback

    import mdmkit.training.train as training

    class CrashInStep8(Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            if trainer.global_step == 7:
                raise RuntimeError("crash in step 8")

    monkeypatch.setattr(training, "progress_callback", CrashInStep8)  # in the place of the progress bar
    with pytest.raises(RuntimeError, match="crash in step 8"):
        _train(tmp_path, "trainer.max_steps=20", "trainer.val_check_interval=5", "trainer.enable_progress_bar=true")
    assert torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 7
    monkeypatch.undo()
    _train(tmp_path, "trainer.max_steps=15", "trainer.val_check_interval=5",
           f"ckpt_path={tmp_path}/checkpoints/last.ckpt")
    assert _steps(tmp_path / "csv/version_0/metrics.csv", "val/loss") == [4]  # logged at the step before, as ever
    assert _steps(tmp_path / "csv/version_1/metrics.csv", "val/loss") == [9, 14]  # was [8, 13]
    assert _steps(tmp_path / "csv/version_1/metrics.csv", "train/loss") == list(range(7, 15))

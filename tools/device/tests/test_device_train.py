"""tools/device/device_train.sh: a training chained over remote calls by what each call brings back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_train.sh"
OVERRIDES = [o for o in TINY if not o.startswith("trainer.max_steps")] + ["evaluate_after_training=false"]


def leg(machine: Path, out: Path, steps: int, **env: str) -> str:
    """One call on a fresh `machine` directory: the script's log."""
    machine.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, **env}
    done = subprocess.run(["bash", str(SCRIPT), "tiny", "00:00:10:00", *OVERRIDES, f"trainer.max_steps={steps}"],
                          cwd=machine, env=environment, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return (out / "tiny.log").read_text()


def steps_trained(model: Path) -> int:
    return torch.load(model, weights_only=False)["train_summary"]["global_step"]


def test_legs_resume_from_what_comes_back_or_warm_restart_from_the_model(tmp_path: Path) -> None:
    first = tmp_path / "out1"
    assert "fresh run in runs/tiny" in leg(tmp_path / "call1", first, steps=4)
    assert {p.name for p in first.iterdir()} == {"tiny.pt", "tiny.tgz", "tiny.log"}
    with tarfile.open(first / "tiny.tgz") as archive:
        assert "tiny/checkpoints/last.ckpt" in archive.getnames()  # a tiny run's state fits: a true resume

    second = tmp_path / "call2"  # the next call: a bare machine with the unpacked archive carried to it
    (second / "runs").mkdir(parents=True)
    shutil.unpack_archive(first / "tiny.tgz", second / "runs")
    assert "resuming runs/tiny/checkpoints/last.ckpt" in leg(second, tmp_path / "out2", steps=6, RESUME_ONLY="1")
    assert steps_trained(tmp_path / "out2" / "tiny.pt") == 6  # steps 5 and 6 only: the run went on

    third = tmp_path / "call3"  # state too large to bring back: the committed model starts the next leg
    (third / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "out2" / "tiny.pt", third / "checkpoints" / "tiny.pt")
    log = leg(third, tmp_path / "out3", steps=2, LIMIT_MB="0")
    assert "warm restart from checkpoints/tiny.pt into runs/tiny/leg1" in log
    assert "last.ckpt is over 0 MB" in log
    assert steps_trained(tmp_path / "out3" / "tiny.pt") == 2
    with tarfile.open(tmp_path / "out3" / "tiny.tgz") as archive:
        assert not [name for name in archive.getnames() if name.endswith(".ckpt")]
    fourth = tmp_path / "call4"  # a bare machine again: the committed logs of leg 1 number the next leg
    (fourth / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "out3" / "tiny.pt", fourth / "checkpoints" / "tiny.pt")
    shutil.unpack_archive(tmp_path / "out3" / "tiny.tgz", fourth / "docs" / "results" / "runs")
    assert "warm restart from checkpoints/tiny.pt into runs/tiny/leg2" in leg(fourth, tmp_path / "out4", steps=2)
    shutil.rmtree(fourth / "runs" / "tiny" / "leg2" / "checkpoints")  # its state too large to keep: its model
    (fourth / "runs" / "tiny" / "leg3" / ".hydra").mkdir(parents=True)  # a leg refused at start-up: nothing in it
    assert "warm restart from runs/tiny/leg2/model.pt into runs/tiny/leg4" in leg(fourth, tmp_path / "out5", steps=2)
    started = torch.load(third / "checkpoints" / "tiny.pt", weights_only=False)
    came_back = torch.load(tmp_path / "out3" / "tiny.pt", weights_only=False)
    assert started["config"]["model"] == came_back["config"]["model"]


def test_resume_only_trains_nothing_on_a_machine_without_the_runs_state(tmp_path: Path) -> None:
    """A two-call leg's second call that finds a bare machine (the first call's was given back): the committed
    model is there, and a warm restart from it would train the leg's starting point again."""
    machine, out = tmp_path / "bare", tmp_path / "out"
    (machine / "checkpoints").mkdir(parents=True)
    (machine / "checkpoints" / "tiny.pt").write_bytes(b"the committed model")
    done = subprocess.run(["bash", str(SCRIPT), "tiny", "00:00:10:00", *OVERRIDES], cwd=machine, capture_output=True,
                          text=True, timeout=WAIT_S, check=False,
                          env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, "RESUME_ONLY": "1"})
    assert done.returncode == 3
    assert "RESUME_ONLY=1, but no last.ckpt of runs/tiny here" in (out / "tiny.log").read_text()
    assert not (out / "tiny.pt").exists() and not (machine / "runs" / "tiny").exists()


@pytest.mark.parametrize("args", [[], ["tiny"]])
def test_too_few_arguments_print_the_usage(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S,
                          check=False)
    assert done.returncode == 2 and "tools/device/device_train.sh NAME MAX_TIME" in done.stdout

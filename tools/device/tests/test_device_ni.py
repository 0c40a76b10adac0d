"""tools/device/device_ni.sh: NI for a trained model in one device call, dry-run on a CPU with tiny settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, WAIT_S

SCRIPT = ROOT / "tools" / "device" / "device_ni.sh"


def test_one_call_brings_back_the_indicator_and_the_ni_rows_of_the_model_trained_there(tmp_path: Path) -> None:
    """The base is the model device_paper.sh left in TRAINED, not checkpoints/<NAME>.pt: each device call's copy
    of the tree puts the committed model back there."""
    out, trained = tmp_path / "out", tmp_path / "trained"
    trained.mkdir()
    shutil.copy(ROOT / "checkpoints" / "sudoku_mdm.pt", trained / "sudoku.pt")
    environment = {
        **os.environ, "TRAINED": str(trained), "OUT": str(out), "WORK": str(tmp_path / "work"),
        "PYTHON": sys.executable,
        "DEVICE": "cpu", "MDMKIT_CACHE_DIR": str(tmp_path), "WHEELS": str(tmp_path),
        "NI_ARGS": "--limit 4 --batch-size 4 --epsilons 0.9",
        "EXTRA": "task.n_train=300 task.n_val=40 task.n_test=40 task.workers=1 trajectories.n_examples=16 "
                 "trajectories.shard_size=16 trajectories.progress=false data.val_examples=8 trainer.max_steps=3 "
                 "trainer.val_check_interval=3",
    }
    done = subprocess.run(["bash", str(SCRIPT), "sudoku"], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    back = out / "ni_sudoku"
    assert {p.name for p in back.iterdir()} == {"indicator.pt", "results.jsonl", "summary.json", "pareto.png", "ni.log",
                                                "metrics.csv"}
    assert "val/" in (back / "metrics.csv").read_text().splitlines()[0]  # the indicator's validation metrics
    assert f"base: {trained / 'sudoku.pt'}" in (back / "ni.log").read_text()
    families = {row["family"] for row in json.loads((back / "summary.json").read_text())["rows"]}
    assert families == {"topk-confidence", "oracle", "threshold-confidence", "ni-topk-confidence"}


def test_a_missing_name_prints_the_usage(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S,
                          check=False)
    assert done.returncode == 2 and "tools/device/device_ni.sh sudoku_paper" in done.stdout


def test_a_machine_that_trained_no_leg_stops_at_once(tmp_path: Path) -> None:
    """A bare machine holds the committed model, not the leg just trained: an indicator for it would be for the
    wrong weights (and take the session's last minutes)."""
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "TRAINED": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT), "sudoku_paper"], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 3 and "checkpoints/sudoku_paper.pt is the committed model" in done.stdout

#!/usr/bin/env bash
# Here, at the start of a session with the device: what a fresh checkout lacks for the Sudoku paper leg of
# docs/results/notes/paper_device_legs.md, step 0, in one command (after `make install`): the wheels the device
# image lacks (.whl/) and the paper split's puzzles (runs/cache/, 8.9 MB: carried, they save the leg making them on
# the device). Prints what to carry.
#   bash tools/device/device_prep.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
export MDMKIT_CACHE_DIR=${MDMKIT_CACHE_DIR:-runs/cache}
bash tools/device/device_wheels.sh
# one batch of the leg's own data options on the CPU: the puzzles are made and cached on the way
"$PYTHON" train.py experiment=sudoku_paper trainer.fast_dev_run=true trainer.accelerator=cpu \
    trainer.precision=32-true data.batch_size=16 data.eval_batch_size=8 evaluate_after_training=false logger=csv \
    trainer.enable_progress_bar=false
"$PYTHON" - <<'PY'
import json
from mdmkit.io.checkpoint import TrainedModel
puzzles = TrainedModel("checkpoints/sudoku_paper.pt").task.cache_path()
paths = [puzzles]
for path in paths:
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
print("carry:", json.dumps([".whl", *map(str, paths)]))
PY

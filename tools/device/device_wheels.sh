#!/usr/bin/env bash
# Here, before a device session: put in .whl/ the pure-Python wheels the device image lacks, at the versions this
# checkout is tested with (read from PYTHON, default .venv/bin/python). The image (Python 3.12) has torch,
# lightning, pyarrow and huggingface_hub 1.x but neither hydra-core, omegaconf, antlr4, datasets, dill nor
# multiprocess (measured 2026-11-26). huggingface_hub stays the image's: a 2.x one breaks its transformers, which
# lightning imports. peft and accelerate serve LoRA fine-tuning. tools/device/device_env.sh installs .whl/ there and
# checks the imports.
#   bash tools/device/device_wheels.sh        then each device run: carry: [.whl]
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir -p .whl
# antlr4 4.9.3 ships only as a source archive: build its wheel
"$PYTHON" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)"
wanted=()
for package in hydra-core omegaconf datasets dill multiprocess peft accelerate; do wanted+=("$package==$(version "$package")"); done
# multiprocess has one wheel per Python version: the device's, not this machine's
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "${wanted[@]}"
ls .whl

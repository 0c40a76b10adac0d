#!/usr/bin/env bash
# The LLM path at real size in one device call: benchmarks.bench_llm_path on the GPU (random-weight networks made on
# the device, one at a time, nothing downloaded), cases by importance until BUDGET seconds (default 420) are spent,
# so the call ends well inside its 10 minutes whatever the card. MODELS is that order: the LLaDA-8B and Dream-7B
# shapes first, then Fast-dLLM v2, LLaDA2.0-mini, LLaDA2.1-mini's decoder on its network, SDAR-8B and SDAR-4B (in
# their blocks of 4) and DiffusionGemma 26B-A4B (encoder pass + canvas decoder, transformers' network: a device
# transformers without it leaves one error row); every model's batch-1 cases come before any larger batch.
#   device run: tools/device/device_llm_path.sh     carry: [.whl]     timeout_s: 560
# Back in $OUT/: llm_path_gpu.{md,json,jsonl,png} (the page, its rows) and llm_path.log. BENCH_ARGS adds options
# (e.g. "--models llada-8b --batches 1 8", which replaces MODELS); DEVICE=cpu with tiny BENCH_ARGS dry-runs the call
# on a CPU.
set -uo pipefail
OUT=${OUT:-runs/out}; DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-420}; BENCH_ARGS=${BENCH_ARGS:-}
MODELS=${MODELS:-llada-8b dream-7b fast-dllm-v2-7b llada2-mini llada2.1-mini sdar-8b sdar-4b diffusiongemma-26b-a4b}
source "$(dirname "$0")/device_env.sh" || exit 1
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$PYTHON" -m benchmarks.bench_llm_path --device "$DEVICE" --repeats 1 --budget-s "$BUDGET" --out "$OUT/llm_path_gpu" \
    --models $MODELS $BENCH_ARGS 2>&1 | tee "$OUT/llm_path.log"
exit "${PIPESTATUS[0]}"

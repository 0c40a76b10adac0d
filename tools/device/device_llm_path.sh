#!/usr/bin/env bash
# The LLM path at real size in one device call: benchmarks.bench_llm_path on the GPU (random-weight networks of the
# LLaDA-8B and Dream-7B shapes made on the device, nothing downloaded), cases by importance until BUDGET seconds
# (default 420) are spent, so the call ends well inside its 10 minutes whatever the card.
#   device run: tools/device/device_llm_path.sh     carry: [.whl]     timeout_s: 560
# Back in $OUT/: llm_path_gpu.{md,json,jsonl,png} (the page, its rows) and llm_path.log. BENCH_ARGS adds options
# (e.g. "--models llada-8b --batches 1 8"); DEVICE=cpu with tiny BENCH_ARGS dry-runs the call on a CPU.
set -uo pipefail
OUT=${OUT:-runs/out}; DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-420}; BENCH_ARGS=${BENCH_ARGS:-}
source "$(dirname "$0")/device_env.sh" || exit 1
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$PYTHON" -m benchmarks.bench_llm_path --device "$DEVICE" --repeats 1 --budget-s "$BUDGET" --out "$OUT/llm_path_gpu" \
    $BENCH_ARGS 2>&1 | tee "$OUT/llm_path.log"
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# One SFT step of a ~1B LLaDA-architecture network in one device call: benchmarks.bench_sft_step on the GPU (full
# fine-tuning and LoRA, gradient checkpointing off and on; random weights made on the device, nothing downloaded),
# no case started after BUDGET seconds (default 300), so the call ends well inside its limit whatever the card.
#   device run: tools/device/device_sft_step.sh     carry: [.whl]     timeout_s: 420
# Back in $OUT/: sft_step_gpu.{md,json,png} (the page) and sft_step.log. BENCH_ARGS adds options (e.g. "--batch 16");
# DEVICE=cpu with tiny BENCH_ARGS (e.g. "--preset tiny --batch 2 --length 16") dry-runs the call on a CPU.
set -uo pipefail
OUT=${OUT:-runs/out}; DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-300}; BENCH_ARGS=${BENCH_ARGS:-}
source "$(dirname "$0")/device_env.sh" || exit 1
mkdir -p "$OUT"
"$PYTHON" -c "import peft" 2> /dev/null \
    || echo "device_sft_step.sh: no peft here: the LoRA cases will fail (carry peft's and accelerate's wheels in .whl)" >&2
# shellcheck disable=SC2086
"$PYTHON" -m benchmarks.bench_sft_step --device "$DEVICE" --preset llada-1b --batch 8 --length 512 --steps 20 \
    --warmup 5 --budget-s "$BUDGET" --out "$OUT/sft_step_gpu" $BENCH_ARGS 2>&1 | tee "$OUT/sft_step.log"
exit "${PIPESTATUS[0]}"

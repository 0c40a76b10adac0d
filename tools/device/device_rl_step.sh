#!/usr/bin/env bash
# One RL step of a LLaDA-8B-shaped network under LoRA in one device call: benchmarks.bench_rl_step on the GPU (random
# weights made on the device in bf16, nothing downloaded; d1's rollout shape: 1 prompt x 8 rollouts, 256 prompt
# tokens and 256 to generate, 2 per forward in blocks of 32; mu = 2 inner updates with gradient checkpointing; with
# and without the reference, the base with its adapters off), no case started after BUDGET seconds (default 300).
#   device run: tools/device/device_rl_step.sh     carry: [.whl]     timeout_s: 480
# Back in $OUT/: rl_step_gpu.{md,json,png} (the page) and rl_step.log. BENCH_ARGS adds options (e.g. "--llm-group
# 16"); DEVICE=cpu with tiny BENCH_ARGS (e.g. "--llm tiny --prompt-len 8 --gen-len 16 --block 8") dry-runs the call
# on a CPU.
set -uo pipefail
OUT=${OUT:-runs/out}; DEVICE=${DEVICE:-cuda}; BUDGET=${BUDGET:-300}; BENCH_ARGS=${BENCH_ARGS:-}
source "$(dirname "$0")/device_env.sh" || exit 1
mkdir -p "$OUT"
"$PYTHON" -c "import peft" 2> /dev/null \
    || echo "device_rl_step.sh: no peft here: the LoRA cases will fail (carry peft's and accelerate's wheels in .whl)" >&2
# shellcheck disable=SC2086
"$PYTHON" -m benchmarks.bench_rl_step --device "$DEVICE" --sudoku none --llm llada-8b --llm-prompts 1 --llm-group 8 \
    --prompt-len 256 --gen-len 256 --block 32 --k 2 --mu 2 --lora-r 16 --checkpointing --steps 2 --warmup 1 \
    --budget-s "$BUDGET" --out "$OUT/rl_step_gpu" $BENCH_ARGS 2>&1 | tee "$OUT/rl_step.log"
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# Issue 20 in one 10-minute device call: the paper-scale models in MODELS (default both, side by side on one GPU:
# each then gets about half its solo rate, docs/results/notes/paper_device_legs.md) train with
# tools/device/device_train.sh until TRAIN_TIME, each continuing from checkpoints/<name>.pt where that exists, with a
# learning-rate decay that ends at TRAIN_TIME (optim.anneal_by=max_time: each leg stops annealed), then
# sweep their fronts on the GPU until the call's DEADLINE (seconds from the start). Everything lands in $OUT:
# <name>.pt, <name>.tgz, <name>.log and the sweep rows <name>_fronts.jsonl (a sweep cut short resumes where it
# stopped: evaluate.py skips rows it has).
#
# Before the call, here: the wheels the device image lacks in .whl/ (tools/device/device_wheels.sh). The training
# data is made there (~64 s of 16 processes for Sudoku) unless its cache file is carried: the Sudoku paper
# split's is 8.9 MB (sudoku_codec), and saves that minute for training. Then
#   device run: tools/device/device_paper.sh     carry: [.whl, runs/cache/sudoku-05f9e5d005b74597.npz]     timeout_s: 595
# A leg over two calls of one session: the first with DEADLINE=0 (no sweep) and EXTRA holding
# optim.anneal_time=<both calls' training time>, the second at once on the still-warm machine with the same EXTRA
# and RESUME_ONLY=1: device_train.sh resumes the run's last.ckpt there and the decay ends; on a bare machine it
# trains nothing (docs/results/notes/paper_device_legs.md).
# EXTRA (train.py overrides for every model) and SWEEP_EXTRA (evaluate.py overrides) make a small dry run on a CPU.
# With EXTRA=compile=true, a compile the device's torch cannot do falls back to eager (TORCHDYNAMO_SUPPRESS_ERRORS,
# logged) rather than losing the leg.
set -uo pipefail
OUT=${OUT:-runs/out}; TRAIN_TIME=${TRAIN_TIME:-00:00:06:00}; DEADLINE=${DEADLINE:-560}
MODELS=${MODELS:-sudoku_paper maze_paper}
EXTRA=${EXTRA:-}; SWEEP_EXTRA=${SWEEP_EXTRA:-batch_size=1000 device=cuda}
started=$SECONDS
source "$(dirname "$0")/device_env.sh" || exit 1
export OUT TORCHDYNAMO_SUPPRESS_ERRORS=${TORCHDYNAMO_SUPPRESS_ERRORS:-1}
mkdir -p "$OUT"
# the GPU's busy share every 2 s: near 100% while training, the GPU is the limit; well under, the host is
SAMPLER=
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > "$OUT/gpu_utilization.csv" 2> /dev/null &
    SAMPLER=$!
fi

leg() {  # NAME: train, then sweep the fronts on the trained model until the deadline
    local name=$1
    # shellcheck disable=SC2086
    tools/device/device_train.sh "$name" "$TRAIN_TIME" "experiment=$name" trainer.max_steps=100000 \
        optim.anneal_by=max_time $EXTRA > /dev/null
    [ -f "$OUT/$name.pt" ] || { echo "[$name] no model: see $name.log"; return 1; }
    # $TRAINED (ignored) outlives this call on a warm machine, for tools/device/device_ni.sh; checkpoints/ is
    # overwritten by the next call's copy of the tree, which holds the committed model until this one is copied in
    mkdir -p "$TRAINED" && cp "$OUT/$name.pt" "$TRAINED/$name.pt" && cp "$OUT/$name.pt" "checkpoints/$name.pt"
    local left=$((DEADLINE - (SECONDS - started)))
    # timeout 0 would mean no limit at all
    [ "$left" -ge 10 ] || { echo "[$name] trained at ${SECONDS}s: no time left to sweep"; return 0; }
    echo "[$name] trained at ${SECONDS}s; sweeping for at most ${left}s"
    # shellcheck disable=SC2086
    timeout --signal=INT "$left" "$PYTHON" evaluate.py "ckpt=checkpoints/$name.pt" "sweep=${name}_fronts" \
        "results_file=$OUT/${name}_fronts.jsonl" wandb.mode=disabled $SWEEP_EXTRA >> "$OUT/$name.log" 2>&1
    echo "[$name] sweep ended ($?) at ${SECONDS}s with $(wc -l < "$OUT/${name}_fronts.jsonl" 2>/dev/null || echo 0) rows"
}

LEGS=()
for name in $MODELS; do leg "$name" & LEGS+=($!); done
[ ${#LEGS[@]} -eq 0 ] || wait "${LEGS[@]}"  # not a bare `wait`: the sampler never ends
[ -z "$SAMPLER" ] || kill "$SAMPLER"
grep -h "trained\|accuracy\|Error\|error" "$OUT"/*.log | tail -n 20
ls -la "$OUT"

#!/usr/bin/env bash
# NI on a paper-scale model in one device call (issue 20): scripts/ni_pipeline.py with experiment=<NAME>_indicator
# on the GPU: the indicator trained on NAME's own full-step trajectories over its training split, then NI against
# threshold and full step with its oracle floor on the test split. Recording 20k trajectories of a 6M model takes
# hours on 2 CPU cores, minutes on a GPU. Run on the machine that just trained NAME, still warm: its model is
# runs/trained/<NAME>.pt (tools/device/device_paper.sh) and its training split is cached in runs/cache/.
#   device run: tools/device/device_ni.sh sudoku_paper     carry: [.whl]     timeout_s: 230
# Back in $OUT/ni_<NAME>/: indicator.pt, results.jsonl, summary.json, pareto.png, ni.log and the indicator's
# metrics.csv. NI_ARGS (ni_pipeline.py options, e.g. "--limit 200") and EXTRA (overrides of the indicator's
# training) make a small dry run on a CPU with DEVICE=cpu. On a machine that trained no leg of NAME (a bare one)
# the script stops at once; ANY_MODEL=1 runs it on the experiment's own base model (checkpoints/<NAME>.pt).
set -uo pipefail
[ $# -eq 1 ] || { sed -n 2,11p "$0"; exit 2; }
NAME=$1
OUT=${OUT:-runs/out}; DEVICE=${DEVICE:-cuda}; NI_ARGS=${NI_ARGS:-}; EXTRA=${EXTRA:-}
source "$(dirname "$0")/device_env.sh" || exit 1
BASE=()
if [ -f "$TRAINED/$NAME.pt" ]; then
    BASE=(--checkpoint "$TRAINED/$NAME.pt")
elif [ "${ANY_MODEL:-0}" != 1 ]; then
    echo "no leg of $NAME was trained on this machine (no $TRAINED/$NAME.pt): checkpoints/$NAME.pt is the committed model (ANY_MODEL=1 runs NI on it)"
    exit 3
fi
WORK=${WORK:-runs/ni_$NAME}; DEST=$OUT/ni_$NAME  # WORK: the pipeline's own output (checkpoints, logs)
rm -rf "$WORK"; mkdir -p "$DEST"
accelerator=cpu; [ "$DEVICE" = cuda ] && accelerator=gpu
# shellcheck disable=SC2086
"$PYTHON" scripts/ni_pipeline.py --experiment "${NAME}_indicator" "${BASE[@]}" --out "$WORK" --device "$DEVICE" \
    --batch-size 1000 --taus 0.9 0.95 0.99 0.995 0.999 $NI_ARGS -- "trainer.accelerator=$accelerator" logger=csv \
    trainer.enable_progress_bar=false $EXTRA 2>&1 | tee "$DEST/ni.log"
status=${PIPESTATUS[0]}
for file in indicator.pt results.jsonl summary.json pareto.png csv/version_0/metrics.csv; do
    [ -f "$WORK/$file" ] && cp "$WORK/$file" "$DEST/"  # metrics.csv: the indicator's validation precision/recall
done
exit "$status"

#!/usr/bin/env bash
# One leg of a training longer than one remote call (a device call of 10 minutes, say), chained by its run
# directory: runs/<NAME> travels to the machine and back.
#
#   tools/device/device_train.sh NAME MAX_TIME [train.py overrides...]      e.g.  sudoku_paper 00:00:05:30 experiment=sudoku_paper
#
# - the run's newest leg (runs/<NAME>, then runs/<NAME>/leg<K>) has checkpoints/last.ckpt: it resumes there
#   (optimizer, EMA, step and data stream);
# - else that leg's model.pt, or the committed checkpoints/<NAME>.pt: a warm restart from those weights (init_from:
#   optimizer and schedule start afresh) in runs/<NAME>/leg<K+1>, K the highest leg here or committed under
#   $LEDGER/<NAME> (docs/results/runs). A 6M-parameter last.ckpt with its Adam states
#   (~100 MB) is over what a device call brings back (16 MiB a file), so paper-scale legs chain this way;
# - else a fresh run in runs/<NAME>.
# RESUME_ONLY=1 allows the first case only: elsewhere it stops at once (status 3), e.g. the second call of a leg
# that finds a bare machine rather than the first call's, where a warm restart would train the committed model again.
# It trains until trainer.max_steps or MAX_TIME ("DD:HH:MM:SS"), whichever comes first, then writes to $OUT
# (default: runs/out): <NAME>.pt (the EMA weights, save_dtype of the run), <NAME>.tgz (config, CSV log,
# results rows; last.ckpt too where the whole archive stays under LIMIT_MB, 16 by default: the device tool
# brings back files of at most 16 MiB) and <NAME>.log. Unpack <NAME>.tgz into runs/ here to chain the next leg
# by resuming; to keep a warm-restarted leg's logs, into $LEDGER (docs/results/runs/README.md).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,20p "$0"; exit 2; }
NAME=$1; MAX_TIME=$2; shift 2
OUT=${OUT:-runs/out}; LIMIT_MB=${LIMIT_MB:-16}; PYTHON=${PYTHON:-python3}; LEDGER=${LEDGER:-docs/results/runs}
RESUME_ONLY=${RESUME_ONLY:-0}
RUN=runs/$NAME
mkdir -p "$OUT" runs
LOG=$OUT/$NAME.log

LATEST=  # the run's newest leg with something to go on from (a leg refused at start-up holds neither)
for leg in $(ls -d "$RUN" "$RUN"/leg* 2> /dev/null | sort -V); do
    if [ -f "$leg/checkpoints/last.ckpt" ] || [ -f "$leg/model.pt" ]; then LATEST=$leg; fi
done
# legs are numbered on from those here and those whose logs are committed (LEDGER: docs/results/runs/README.md)
LEGS=$(ls -d "$RUN"/leg* "$LEDGER/$NAME"/leg* 2> /dev/null | sed 's/.*leg//' | sort -n | tail -n 1)
LEGS=${LEGS:-0}
if [ -n "$LATEST" ] && [ -f "$LATEST/checkpoints/last.ckpt" ]; then
    DIR=$LATEST
    START=(ckpt_path="$DIR")
    echo "[$NAME] resuming $DIR/checkpoints/last.ckpt" | tee -a "$LOG"
elif [ "$RESUME_ONLY" = 1 ]; then
    echo "[$NAME] RESUME_ONLY=1, but no last.ckpt of runs/$NAME here (a bare machine?): nothing trained" | tee -a "$LOG"
    exit 3
elif [ -n "$LATEST" ] && [ -f "$LATEST/model.pt" ] || [ -f "checkpoints/$NAME.pt" ]; then
    FROM=checkpoints/$NAME.pt; [ -n "$LATEST" ] && [ -f "$LATEST/model.pt" ] && FROM=$LATEST/model.pt
    DIR=$RUN/leg$((LEGS + 1))
    START=(init_from="$FROM" "hydra.run.dir=$DIR")
    echo "[$NAME] warm restart from $FROM into $DIR" | tee -a "$LOG"
else
    DIR=$RUN
    START=("hydra.run.dir=$DIR")
    echo "[$NAME] fresh run in $DIR" | tee -a "$LOG"
fi

"$PYTHON" "$(dirname "$0")/../../train.py" "$@" "${START[@]}" "trainer.max_time='$MAX_TIME'" logger=csv \
    "results_file=$DIR/results.jsonl" trainer.enable_progress_bar=false 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}

[ -f "$DIR/model.pt" ] && cp "$DIR/model.pt" "$OUT/$NAME.pt"
# the archive: everything of the run but its checkpoints, then last.ckpt if the whole still fits
tar -czf "$OUT/$NAME.tgz" -C runs --exclude='*.ckpt' --exclude='model.pt' "$NAME"
if [ -f "$DIR/checkpoints/last.ckpt" ]; then
    tar -czf "$OUT/$NAME.full.tgz" -C runs --exclude='model.pt' --exclude='step*.ckpt' "$NAME"
    if [ "$(stat -c %s "$OUT/$NAME.full.tgz")" -le $((LIMIT_MB * 1024 * 1024)) ]; then
        mv "$OUT/$NAME.full.tgz" "$OUT/$NAME.tgz"
    else
        rm "$OUT/$NAME.full.tgz"
        echo "[$NAME] last.ckpt is over ${LIMIT_MB} MB with the run: the next leg warm-restarts from $NAME.pt" | tee -a "$LOG"
    fi
fi
exit "$status"

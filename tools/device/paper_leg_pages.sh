#!/usr/bin/env bash
# After a device session's Sudoku paper leg (issue 20), here: the measuring half of step 3 in
# docs/results/notes/paper_device_legs.md, as one chain (~45 min on 2 cores: run it in the background). It logs
# each command with its time and stops at the first that fails.
#
#   tools/device/paper_leg_pages.sh FROM > runs/leg_pages.log 2>&1 &
#
# FROM: the folder of what the leg's last device call brought back: sudoku_paper.pt, sudoku_paper.tgz,
# sudoku_paper_fronts.jsonl, and ni_sudoku_paper/ where the session trained NI's indicator. The model it
# replaces is HEAD's checkpoints/sudoku_paper.pt (kept as runs/legs/sudoku_paper_replaced.pt for the errors
# page's puzzle-by-puzzle comparison). Left to a person: the notes under docs/results/notes/, then the pages
# that draw in seconds from the rows made here (training_report.py and pareto.py, commands on the pages), and
# the commit; should the new model be worse, `git checkout checkpoints/sudoku_paper.pt` after reading them.
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1/sudoku_paper.pt" ] && [ -f "$1/sudoku_paper.tgz" ] \
    || { sed -n 2,13p "$0"; echo "paper_leg_pages.sh: FROM must hold sudoku_paper.pt and sudoku_paper.tgz" >&2; exit 2; }
FROM=$1; PYTHON=${PYTHON:-python}
MODEL=checkpoints/sudoku_paper.pt
started=$SECONDS

step() {  # DESCRIPTION COMMAND...: run, log, time
    local what=$1 begun=$SECONDS; shift
    echo "== $what: $*"
    "$@"
    echo "== $what: done in $((SECONDS - begun)) s ($(((SECONDS - started) / 60)) min in all)"
}

install_leg() {
    mkdir -p runs/legs
    git show "HEAD:$MODEL" > runs/legs/sudoku_paper_replaced.pt
    cp "$FROM/sudoku_paper.pt" "$MODEL"
    tar -xzf "$FROM/sudoku_paper.tgz" -C docs/results/runs --exclude='*.ckpt'
    if [ -f "$FROM/sudoku_paper_fronts.jsonl" ]; then
        cp "$FROM/sudoku_paper_fronts.jsonl" docs/results/sudoku_paper_fronts.jsonl
        echo "device fronts: $(wc -l < docs/results/sudoku_paper_fronts.jsonl) rows (a whole sweep has 52)"
    else
        echo "no device fronts in $FROM: docs/results/sudoku_paper_fronts.jsonl still holds the replaced model's rows"
    fi
    if [ -f "$FROM/gpu_utilization.csv" ]; then  # device_paper.sh's samples, most of them while training
        echo "GPU busy, median of this call's 2-s samples: $(awk -F', ' 'NR > 1 {print $2 + 0}' \
            "$FROM/gpu_utilization.csv" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')%"
    fi
    if [ -f "$FROM/ni_sudoku_paper/indicator.pt" ]; then
        cp "$FROM/ni_sudoku_paper/indicator.pt" checkpoints/sudoku_paper_indicator.pt
    fi
}

cpu_fronts() {  # the CPU page's rows are this model's alone
    rm -f docs/results/sudoku_paper_fronts_cpu.jsonl
    "$PYTHON" evaluate.py "ckpt=$MODEL" sweep=sudoku_paper_fronts limit=100 batch_size=100 \
        results_file=docs/results/sudoku_paper_fronts_cpu.jsonl wandb.mode=disabled
}

ni_rows() {
    rm -rf outputs/ni/sudoku_paper_eval
    "$PYTHON" scripts/ni_pipeline.py --indicator checkpoints/sudoku_paper_indicator.pt --checkpoint "$MODEL" \
        --out outputs/ni/sudoku_paper_eval --batch-size 250 --threads 2 \
        --epsilons 0.5 0.8 0.9 0.95 0.99 --taus 0.9 0.95 0.99 0.995 0.999
    cp outputs/ni/sudoku_paper_eval/results.jsonl docs/results/ni_sudoku_paper.jsonl
}

step "the leg's model, logs and device rows" install_leg
step "test split (8 min)" "$PYTHON" evaluate.py "ckpt=$MODEL" results_file=docs/results/runs/sudoku_paper/report.jsonl \
    wandb.mode=disabled
step "CPU fronts on 100 puzzles (6 min)" cpu_fronts
step "EB mechanism (1 min)" "$PYTHON" -m experiments.sudoku_analysis.eb_mechanism "$MODEL" --gammas 1e-5 1e-4 1e-3 0.1 --limit 200 \
    --out docs/results/sudoku_paper_eb_mechanism
step "errors, replaced model beside the new one (16-19 min)" "$PYTHON" -m experiments.sudoku_analysis.sudoku_errors \
    runs/legs/sudoku_paper_replaced.pt "$MODEL" checkpoints/sudoku_mdm.pt --out docs/results/sudoku_paper_errors \
    --notes docs/results/notes/sudoku_paper_errors.md
if [ -f "$FROM/ni_sudoku_paper/indicator.pt" ]; then
    step "NI rows with the leg's indicator (15 min)" ni_rows
else
    echo "== no indicator in $FROM/ni_sudoku_paper: the NI page stays on the replaced model (say so on it)"
fi
echo "== all done in $(((SECONDS - started) / 60)) min: write the notes, then training_report.py and pareto.py"

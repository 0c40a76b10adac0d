#!/usr/bin/env bash
# The Sudoku RL before/after study (docs/results/rl_sudoku.md), from the repository root:
#   bash experiments/rl_sudoku/run.sh            # evaluate the start, train and evaluate d1, wd1 and coupled
#   bash experiments/rl_sudoku/run.sh eval CKPT  # one checkpoint on the grid
#   bash experiments/rl_sudoku/run.sh train RL   # one run (RL: grpo, wd1, coupled) into runs/rl_sudoku/RL
#   RUN=grpo_elbo bash experiments/rl_sudoku/run.sh train grpo rl_estimator@rl.estimator=elbo   # a variant
# Every checkpoint is scored on the same 1,000 test puzzles (the start's own 30-36-givens split) with the same
# samplers at temperature 0: full step (Top-1, confidence) and threshold at several tau. Rows go to RESULTS
# (resumable: rows already there are skipped); then the page: python -m experiments.rl_sudoku.page.
set -euo pipefail
RESULTS=${RESULTS:-docs/results/rl_sudoku.jsonl}
TAUS=${TAUS:-0.8,0.9,0.95,0.99}
TEST=(task=sudoku 'task.n_givens=[30,36]' task.n_train=100000)   # the start's test split, whatever a run trained on

evaluate() {
    python evaluate.py -m ckpt="$1" "${TEST[@]}" sampler=threshold "sampler.tau=$TAUS" results_file="$RESULTS" \
        wandb.mode=disabled
    python evaluate.py ckpt="$1" "${TEST[@]}" sampler=topk sampler.k=1 results_file="$RESULTS" wandb.mode=disabled
}

train() {
    python train.py experiment=sudoku_rl_hard rl="$1" hydra.run.dir="runs/rl_sudoku/${RUN:-$1}" "${@:2}"
}

case "${1:-all}" in
    eval) evaluate "$2" ;;
    train) train "${@:2}" ;;
    all)
        evaluate checkpoints/sudoku_mdm.pt
        for rl in grpo wd1 coupled; do
            train "$rl"
            evaluate "runs/rl_sudoku/$rl/model.pt"
        done ;;
    *) echo "usage: $0 [all | eval CKPT | train RL [overrides...]]" >&2; exit 2 ;;
esac

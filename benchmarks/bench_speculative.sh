#!/bin/bash
# The self-speculative benchmark of docs/results/speculative.md (issue #7): train each hybrid beside its
# same-architecture MDM with the same data, optimiser, seed and steps, sweep both, write the pages.
# Sized for one GPU (about 10 minutes with the jobs side by side on an H100); on 2 CPU cores expect hours.
# Sudoku's MDM is the committed checkpoints/sudoku_mdm.pt. Text needs gsm8k_train.jsonl in $MDMKIT_BENCHMARK_DATA.
# Environment: EXTRA_TRAIN / EXTRA_SWEEP (overrides appended to every run, e.g. for a quick CPU check),
# PAGES (where the pages go, default docs/results).
set -euo pipefail
R=${1:-outputs/bench_speculative}
D=${PAGES:-docs/results}
TRAIN="trainer=gpu trainer.precision=32-true logger=csv results_file=$R/train_rows.jsonl"
train() { python train.py "${@:2}" $TRAIN hydra.run.dir=$R/$1 ${EXTRA_TRAIN:-}; }
sweep() { python evaluate.py ckpt=$2 results_file=$R/$1.jsonl wandb.mode=disabled "${@:3}" ${EXTRA_SWEEP:-}; }

train maze_mdm experiment=maze_mdm trainer.max_steps=9000 trainer.val_check_interval=3000 &
train maze_hybrid experiment=maze_speculative trainer.max_steps=9000 trainer.val_check_interval=3000 &
train sudoku_hybrid experiment=sudoku_speculative &
train text_mdm experiment=text_mdm trainer.max_steps=6000 &
train text_hybrid experiment=text_speculative trainer.max_steps=6000 &
wait
sweep maze $R/maze_mdm/model.pt sweep=speculative_baseline &
sweep maze $R/maze_hybrid/model.pt sweep=speculative_fronts &
sweep sudoku checkpoints/sudoku_mdm.pt sweep=speculative_baseline &
sweep sudoku $R/sudoku_hybrid/model.pt sweep=speculative_fronts &
sweep text $R/text_mdm/model.pt sweep=speculative_text_baseline limit=1024 batch_size=512 &
sweep text $R/text_hybrid/model.pt sweep=speculative_text limit=1024 batch_size=512 &
wait

page() {  # page NAME TASK MDM_CKPT HYBRID_CKPT BASELINE [pareto.py options...]
  python scripts/pareto.py $R/$1.jsonl --task $2 --cost --tag "$3=mdm" --tag "$4=hybrid" \
    --baseline "mdm: $5" --out $D/speculative_$1 "${@:6}"
}
page maze maze $R/maze_mdm/model.pt $R/maze_hybrid/model.pt topk-confidence
page sudoku sudoku checkpoints/sudoku_mdm.pt $R/sudoku_hybrid/model.pt topk-confidence
page text gsm8k_chars $R/text_mdm/model.pt $R/text_hybrid/model.pt window-random --metric spelling_accuracy --keep 0.95
python scripts/speculative_figure.py $D/speculative_maze.jsonl:accuracy $D/speculative_sudoku.jsonl:accuracy \
  $D/speculative_text.jsonl:spelling_accuracy --out $D/speculative

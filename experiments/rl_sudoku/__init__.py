"""RL on the CPU Sudoku model, before and after: `run.sh` trains d1, wd1 and coupled-GRPO runs and scores every
checkpoint on one test split with one sampler grid; `page` turns the rows into the page's plot and table. See
README.md."""

"""The page's bookkeeping: which rows are the grid's, how checkpoints are named, the table's differences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.rl_sudoku.page import (
    START,
    collect,
    front_at,
    in_grid,
    label,
    table_markdown,
    training_markdown,
)


def row(checkpoint: str, family: str, accuracy: float, nfe: float, **params: Any) -> dict[str, Any]:
    return {"checkpoint": checkpoint, "family": family, "kind": "evaluate", "accuracy": accuracy, "nfe_mean": nfe,
            "params": {"ordering": "confidence", **params}}


def test_checkpoints_are_named_by_their_run() -> None:
    assert label("runs/rl_sudoku/wd1/model.pt") == "wd1"
    assert label("checkpoints/sudoku_mdm.pt") == START


def test_only_the_grid_is_kept_and_a_later_row_replaces_an_earlier() -> None:
    rows = [row("checkpoints/sudoku_mdm.pt", "topk-confidence", 0.90, 48.0, k=1),
            row("checkpoints/sudoku_mdm.pt", "topk-confidence", 0.80, 24.0, k=2),  # not in the grid
            row("checkpoints/sudoku_mdm.pt", "eb-confidence", 0.70, 9.0, gamma=0.1),  # not in the grid
            row("checkpoints/sudoku_mdm.pt", "topk-confidence", 0.93, 48.1, k=1),
            row("runs/rl_sudoku/grpo/model.pt", "threshold-confidence", 0.95, 7.25, tau=0.99)]
    assert not in_grid({**rows[0], "kind": "oracle"})
    assert collect(rows) == {START: {"full step": (0.93, 48.1)}, "grpo": {"threshold tau=0.99": (0.95, 7.25)}}


def test_the_table_gives_each_run_its_points_against_the_start() -> None:
    table = {START: {"full step": (0.930, 48.1)}, "grpo": {"full step": (0.955, 48.0)}, "wd1": {}}
    lines = table_markdown(table, [START, "grpo", "wd1"]).splitlines()
    assert lines[2] == "| full step | 93.0 (48.1) | 95.5 (48.0) +2.5 | — |"


def test_the_training_table_averages_the_first_and_last_steps(tmp_path: Path) -> None:
    logs = tmp_path / "grpo" / "csv" / "version_0"
    logs.mkdir(parents=True)
    keys = ["step", "rl/reward", "rl/reward/verified", "rl/reward/cells", "rl/reward_std", "rl/nfe", "rl/kl"]
    lines = [",".join(keys), "0,,,,,,", "0,1.5,0.5,1.0,0.2,10,0.0", "1,2.0,1.0,1.0,0.0,6,0.25"]
    (logs / "metrics.csv").write_text("\n".join(lines) + "\n")
    row = training_markdown(tmp_path, window=1).splitlines()[2]
    assert row == "| grpo | 2 | 0.50 → 1.00 | 1.00 → 1.00 | 0.20 → 0.00 | 10.00 → 6.00 | 0.2500 |"


def test_a_moved_point_is_also_compared_at_equal_nfe_on_the_start_front() -> None:
    front = [(0.25, 6.0), (0.75, 7.0)]
    assert front_at(front, 6.5) == 0.5
    assert front_at(front, 5.0) is None
    table = {START: {"threshold tau=0.9": (0.75, 7.0)}, "grpo": {"threshold tau=0.9": (0.625, 6.5)}}
    row = table_markdown(table, [START, "grpo"], front).splitlines()[2]
    assert row == "| threshold tau=0.9 | 75.0 (7.0) | 62.5 (6.5) -12.5; +12.5 at equal NFE |"

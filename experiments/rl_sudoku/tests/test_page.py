"""The page's bookkeeping: which rows are the grid's, how checkpoints are named, the table's differences."""

from __future__ import annotations

from typing import Any

from experiments.rl_sudoku.page import START, collect, in_grid, label, table_markdown


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

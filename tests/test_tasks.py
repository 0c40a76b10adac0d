"""Task serialization, scoring, caching, split disjointness and malformed-file errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, compose_config

from mdmkit.core.config import build
from mdmkit.core.errors import DataFormatError
from mdmkit.tasks.base import Split, assert_disjoint, pack_tokens
from mdmkit.tasks.maze import MazeTask
from mdmkit.tasks.sudoku import SudokuTask

PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def sudoku(tmp_path: Path, **kwargs) -> SudokuTask:
    settings = {"n_train": 60, "n_val": 20, "n_test": 20, "n_givens": 34, "cache_dir": str(tmp_path)}
    return SudokuTask(**{**settings, **kwargs})


def maze(tmp_path: Path, **kwargs) -> MazeTask:
    return MazeTask(**{"n_train": 60, "n_val": 20, "n_test": 20, "grid_size": 4, "cache_dir": str(tmp_path), **kwargs})


def test_sudoku_serialization_has_89_tokens_and_masks_the_blanks(tmp_path: Path) -> None:
    task = sudoku(tmp_path)
    splits = task.load_splits()
    assert splits["train"].tokens.shape == (60, 89)
    assert task.vocab_size == 11 and task.mask_id == 10
    eol = splits["train"].tokens[:, 9::10]
    assert (eol == 9).all()  # 8 end-of-line tokens
    assert (splits["test"].answer_mask.sum(1) == 81 - 34).all()
    assert not splits["test"].answer_mask[:, 9::10].any()
    text = task.decode(splits["test"].tokens[0]).replace(" ", "")
    assert len(text.splitlines()) == 9


def test_sudoku_score_accepts_solutions_only(tmp_path: Path) -> None:
    task = sudoku(tmp_path)
    test = task.load_splits()["test"]
    tokens, answer = test.tokens, test.answer_mask
    assert task.score(tokens, tokens, answer).all()
    broken = tokens.clone()
    broken[:, 0], broken[:, 1] = tokens[:, 1], tokens[:, 0]  # a swap breaks two columns
    assert not task.score(broken, tokens, answer).any()
    with_mask = tokens.clone()
    with_mask[answer] = task.mask_id
    assert not task.score(with_mask, tokens, answer).any()


def test_sudoku_score_accepts_any_valid_completion_keeping_givens() -> None:
    task = SudokuTask(n_train=1, n_val=1, n_test=1)
    from mdmkit.tasks.sudoku import serialize

    solution = torch.from_numpy(serialize(np.array([[int(c) for c in SOLUTION]])))
    relabel = torch.tensor([1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # swap digits 1 and 2: still a valid grid
    other = relabel[solution]
    all_blank = torch.ones_like(solution, dtype=torch.bool)
    all_blank[:, 9::10] = False
    assert task.score(other, solution, all_blank).all()  # nothing given: any valid grid solves it
    some_given = all_blank.clone()
    some_given[0, (solution[0] <= 1).nonzero()[:1, 0]] = False  # a given that the relabelling changed
    assert not task.score(other, solution, some_given).any()


def test_splits_are_cached_deterministic_and_disjoint(tmp_path: Path) -> None:
    first = sudoku(tmp_path).load_splits()
    assert sudoku(tmp_path).cache_path().exists()
    again = sudoku(tmp_path).load_splits()
    fresh = sudoku(tmp_path / "other").load_splits()
    for name in first:
        assert torch.equal(first[name].tokens, again[name].tokens)
        assert torch.equal(first[name].tokens, fresh[name].tokens)  # regenerated from the seed: same data
    keys = np.concatenate([s.keys for s in first.values()])
    assert len(set(keys.tolist())) == len(keys)
    assert sudoku(tmp_path, seed=1).fingerprint() != sudoku(tmp_path).fingerprint()
    assert sudoku(tmp_path, n_givens=30).fingerprint() != sudoku(tmp_path).fingerprint()


def test_tasks_built_in_python_cache_where_the_configs_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from mdmkit.training.indicator.trajectories import TrajectoryConfig

    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(tmp_path))  # was ignored by SudokuTask(), honoured by task=sudoku
    assert SudokuTask().cache_dir == str(tmp_path) == build(compose_config("train", []).task, "task").cache_dir
    assert TrajectoryConfig(checkpoint=str(ROOT / "checkpoints/sudoku_mdm.pt")).root == f"{tmp_path}/trajectories"
    monkeypatch.delenv("MDMKIT_CACHE_DIR")
    assert MazeTask().cache_dir == "~/.cache/mdmkit"


def test_the_cache_is_compact_and_reads_back_the_same_splits(tmp_path: Path) -> None:
    made = sudoku(tmp_path).load_splits()
    with np.load(sudoku(tmp_path).cache_path()) as cached:
        assert sorted(cached.files) == ["codes", "givens"]  # 27 bytes a puzzle (sudoku_codec), keys recomputed
    for name, split in sudoku(tmp_path).load_splits().items():
        assert split.tokens.dtype == torch.int64 and torch.equal(split.tokens, made[name].tokens)
        assert split.keys.tolist() == made[name].keys.tolist()
    maze(tmp_path).load_splits()
    with np.load(maze(tmp_path).cache_path()) as cached:
        assert cached["tokens"].dtype == np.uint8  # the generic layout: one byte per token


def test_a_sudoku_cache_in_another_layout_is_named_with_the_fix(tmp_path: Path) -> None:
    task = sudoku(tmp_path)
    examples = task._read_cache(task.cache_path()) if task.load_splits() else None
    np.savez_compressed(task.cache_path(), **pack_tokens(examples))  # the generic layout, not Sudoku's code
    with pytest.raises(DataFormatError, match=f"{task.cache_path()}: a sudoku cache holds 'codes' and 'givens'.*"
                                              "delete the file and it is made again"):
        sudoku(tmp_path).load_splits()


def test_test_split_is_stable_when_train_size_changes(tmp_path: Path) -> None:
    small, large = sudoku(tmp_path).load_splits(), sudoku(tmp_path, n_train=90).load_splits()
    assert torch.equal(small["test"].tokens, large["test"].tokens)


def test_overlapping_splits_are_refused() -> None:
    tokens = torch.zeros(2, 3, dtype=torch.long)
    split = Split(tokens, tokens.bool(), np.array([b"a", b"b"]))
    other = Split(tokens, tokens.bool(), np.array([b"c", b"a"]))
    with pytest.raises(DataFormatError, match="both the train and test splits"):
        assert_disjoint({"train": split, "test": other})


def test_sudoku_file_is_read_and_solved(tmp_path: Path) -> None:
    path = tmp_path / "puzzles.txt"
    relabelled = PUZZLE.translate(str.maketrans("12", "21")).replace("0", ".")  # another puzzle, '.' blanks
    path.write_text(f"# a classic\n{PUZZLE}\n{relabelled}\n")
    task = sudoku(tmp_path, test_file=str(path))
    test = task.load_splits()["test"]
    assert len(test) == 2
    cells = test.tokens[0][test.tokens[0] != 9] + 1
    assert "".join(map(str, cells.tolist())) == SOLUTION


@pytest.mark.parametrize(
    "line, message",
    [
        (PUZZLE[:-1], ":2: expected 81 characters"),
        (PUZZLE[:-1] + "x", ":2: expected 81 characters"),
        ("55" + PUZZLE[2:], ":2: puzzle has no solution"),
        ("0" * 81, ":2: puzzle has several solutions"),
        (SOLUTION, ":2: every cell is given: nothing to fill"),
        (PUZZLE.replace("0", "."), "1 of its 2 examples repeat an earlier one"),  # it would count twice
    ],
)
def test_malformed_sudoku_file_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(f"{PUZZLE}\n{line}\n")
    with pytest.raises(DataFormatError, match=message):
        sudoku(tmp_path, test_file=str(path)).load_splits()


def test_maze_serialization_and_exact_path_score(tmp_path: Path) -> None:
    task = maze(tmp_path)
    test = task.load_splits()["test"]
    assert test.tokens.shape == (20, task.seq_len) and task.seq_len == 2 * 15 + 4 + 16
    assert (test.answer_mask.sum(1) == 16).all()
    assert task.score(test.tokens, test.tokens, test.answer_mask).all()
    wrong = test.tokens.clone()
    wrong[:, task.answer_start + 1] = (wrong[:, task.answer_start + 1] + 1) % 16
    assert not task.score(wrong, test.tokens, test.answer_mask).any()


def test_maze_file_round_trip_and_malformed_lines(tmp_path: Path) -> None:
    task = maze(tmp_path)
    good = {"edges": [[r * 4 + c, r * 4 + c + 1] for r in range(4) for c in range(3)] + [[0, 4], [4, 8], [8, 12]],
            "start": 3, "goal": 15}
    path = tmp_path / "mazes.jsonl"
    path.write_text(json.dumps(good) + "\n")
    test = maze(tmp_path, test_file=str(path)).load_splits()["test"]
    answer = test.tokens[0, task.answer_start :].tolist()
    assert answer[:10] == [3, 2, 1, 0, 4, 8, 12, 13, 14, 15]
    assert set(answer[10:]) == {task.vocab.index("[PAD]")}
    bad_edge = {**good, "edges": good["edges"][:-1] + [[8, 13]]}
    for lines, message in [
        ([json.dumps(good), "{not json"], ":2: not a valid 4x4 maze"),
        ([json.dumps(good), json.dumps({"edges": good["edges"]})], ":2: not a valid 4x4 maze"),
        ([json.dumps(bad_edge)], ":1: not a valid 4x4 maze"),
        ([json.dumps({**good, "start": 2.7})], ":1: .*cell 2.7 is not an integer"),  # not coerced to 2
        ([json.dumps({**good, "goal": "15"})], ':1: .*cell "15" is not an integer'),
        ([json.dumps({**good, "edges": [[True, 1]] + good["edges"][1:]})], ":1: .*cell true is not an integer"),
        (['{"edges": [[1e400, 1]], "start": 0, "goal": 1}'], ":1: .*cell Infinity is not an integer"),
        ([json.dumps({**good, "goal": 3})], ":1: .*start and goal are the same cell"),
        ([json.dumps(good), json.dumps(good)], "1 of its 2 examples repeat an earlier one"),
    ]:
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(DataFormatError, match=message):
            maze(tmp_path, test_file=str(path)).load_splits()


def test_a_test_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "binary.txt"
    path.write_bytes(b"\xff\xfe" + PUZZLE.encode())
    with pytest.raises(DataFormatError, match="binary.txt: not UTF-8 text"):
        sudoku(tmp_path, test_file=str(path)).load_splits()


def test_maze_cells_answer_marks_exactly_the_path_cells(tmp_path: Path) -> None:
    as_path, as_cells = maze(tmp_path), maze(tmp_path, answer="cells")
    assert as_path.fingerprint() != as_cells.fingerprint()
    paths, cells = as_path.load_splits()["test"], as_cells.load_splits()["test"]
    on = as_cells.vocab.index("[ON]")
    for path_row, cell_row in zip(paths.tokens, cells.tokens):
        assert torch.equal(path_row[: as_path.answer_start], cell_row[: as_cells.answer_start])  # same maze
        path = [int(c) for c in path_row[as_path.answer_start :] if c < as_path.n_cells]
        marked = torch.nonzero(cell_row[as_cells.answer_start :] == on).flatten().tolist()
        assert sorted(path) == marked
    assert as_cells.score(cells.tokens, cells.tokens, cells.answer_mask).all()
    wrong = cells.tokens.clone()
    flipped = on + as_cells.vocab.index("[OFF]") - wrong[:, as_cells.answer_start]
    wrong[:, as_cells.answer_start] = flipped  # flip cell 0
    assert not as_cells.score(wrong, cells.tokens, cells.answer_mask).any()


def test_the_runbooks_carried_cache_is_the_paper_experiments() -> None:
    """The device runbook carries runs/cache/<this name> to skip making the paper split: a change to the
    experiment's data settings changes the name, and the runbook must follow (else the leg remakes the data)."""
    task = build(compose_config("train", ["experiment=sudoku_paper"]).task, "task")
    name = task.cache_path().name
    assert name == "sudoku-05f9e5d005b74597.npz"
    runbook = ROOT / "docs" / "results" / "notes" / "paper_device_legs.md"
    assert f"runs/cache/{name}" in runbook.read_text()

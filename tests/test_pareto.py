"""Pareto fronts of accuracy vs NFE: front extraction, interpolation, speedups, row loading, plot and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WAIT_S

from mdmkit.analysis import pareto, pareto_tables
from mdmkit.analysis.aup import family_aup
from mdmkit.analysis.pareto import Point
from mdmkit.analysis.pareto_plot import plot_fronts

ROOT = Path(__file__).resolve().parents[1]


def row(family: str | None, nfe: float, accuracy: float, *, kind: str = "evaluate", time: str = "2025-01-01T00:00:00",
        task: str = "sudoku", sha: str = "abc1234def", target: str = "mdmkit.samplers.EBSampler", **sampler) -> dict:
    record = {"kind": kind, "task": task, "checkpoint": "checkpoints/sudoku_mdm.pt", "checkpoint_sha": sha,
              "sampler": {"_target_": target, "ordering": "confidence", **sampler}, "accuracy": accuracy,
              "accuracy_ci95": [max(0.0, accuracy - 0.02), min(1.0, accuracy + 0.02)],
              "nfe_mean": nfe, "n": 100, "time": time}
    if family is not None:
        record["family"] = family
    return record


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sample_rows() -> list[dict]:
    rows = [row("topk-confidence", nfe, acc, target="mdmkit.samplers.TopKSampler", k=k)
            for k, nfe, acc in ((1, 81.0, 0.90), (2, 41.0, 0.86), (4, 21.0, 0.70), (8, 11.0, 0.40))]
    rows += [row("eb-entropy", nfe, acc, gamma=g)
             for g, nfe, acc in ((0.01, 30.0, 0.90), (0.1, 15.0, 0.89), (1.0, 8.0, 0.60), (2.0, 9.0, 0.50))]
    rows += [{**row(None, nfe, acc, kind="oracle"), "sampler": {"name": "oracle", "reference": {"k": k}}}
             for k, nfe, acc in ((1, 20.0, 0.90), (4, 9.0, 0.70))]
    return rows


# --------------------------------------------------------------------------------------------- fronts


def test_front_removes_dominated_points_and_sorts_by_nfe():
    front = pareto.pareto_front([(40, 0.9, "a"), (10, 0.5, "b"), (20, 0.4, "c"), (30, 0.95, "d"), (25, 0.7, "e")])
    assert [(p.nfe, p.accuracy, p.payload) for p in front] == [(10, 0.5, "b"), (25, 0.7, "e"), (30, 0.95, "d")]


def test_front_ties():
    identical = pareto.pareto_front([(10, 0.5, "first"), (10, 0.5, "second")])
    assert identical == [Point(10, 0.5, "first")]
    same_nfe = pareto.pareto_front([(10, 0.5), (10, 0.7), (20, 0.6)])
    assert same_nfe == [Point(10, 0.7)]
    same_accuracy = pareto.pareto_front([(20, 0.5), (10, 0.5), (30, 0.8)])
    assert same_accuracy == [Point(10, 0.5), Point(30, 0.8)]


def test_front_single_and_empty():
    assert pareto.pareto_front([(5, 0.3, {"x": 1})]) == [Point(5, 0.3, {"x": 1})]
    assert pareto.pareto_front([]) == []


def test_fronts_by_family_and_overall_front_leave_oracle_out():
    rows = sample_rows()
    fronts = pareto.fronts_by_family(rows)
    assert list(fronts) == ["eb-entropy", "topk-confidence", "oracle"]
    assert [p.nfe for p in fronts["eb-entropy"]] == [8.0, 15.0, 30.0]  # 9.0/0.50 is dominated by 8.0/0.60
    assert [p.nfe for p in fronts["topk-confidence"]] == [11.0, 21.0, 41.0, 81.0]
    assert [p.nfe for p in pareto.overall_front(rows)] == [8.0, 15.0, 30.0]
    assert all(p.payload["kind"] == "evaluate" for p in pareto.overall_front(rows))


# -------------------------------------------------------------------------------------- interpolation

FRONT = [Point(10, 0.5), Point(20, 0.7), Point(40, 0.9)]


def test_interpolate_accuracy_inside_and_outside():
    assert pareto.interpolate_accuracy(FRONT, 15) == pytest.approx(0.6)
    assert pareto.interpolate_accuracy(FRONT, 30) == pytest.approx(0.8)
    assert pareto.interpolate_accuracy(FRONT, 10) == pytest.approx(0.5)
    assert pareto.interpolate_accuracy(FRONT, 40) == pytest.approx(0.9)
    assert pareto.interpolate_accuracy(FRONT, 5) is None
    assert pareto.interpolate_accuracy(FRONT, 41) is None
    assert pareto.interpolate_accuracy([], 10) is None
    assert pareto.interpolate_accuracy([(7, 0.4)], 7) == pytest.approx(0.4)


def test_nfe_at_accuracy():
    assert pareto.nfe_at_accuracy(FRONT, 0.6) == pytest.approx(15)
    assert pareto.nfe_at_accuracy(FRONT, 0.8) == pytest.approx(30)
    assert pareto.nfe_at_accuracy(FRONT, 0.7) == pytest.approx(20)
    assert pareto.nfe_at_accuracy(FRONT, 0.5) == pytest.approx(10)
    assert pareto.nfe_at_accuracy(FRONT, 0.2) == pytest.approx(10)  # already reached at the first point
    assert pareto.nfe_at_accuracy(FRONT, 0.9) == pytest.approx(40)
    assert pareto.nfe_at_accuracy(FRONT, 0.91) is None
    assert pareto.nfe_at_accuracy([], 0.5) is None
    # raw points: dominated ones do not bend the curve
    assert pareto.nfe_at_accuracy([*FRONT, (30, 0.6), (50, 0.85)], 0.8) == pytest.approx(30)


def test_speedup_on_hand_made_fronts():
    baseline = [(10, 0.5), (40, 0.9)]
    candidate = [(5, 0.6), (10, 0.9)]
    assert pareto.speedup(candidate, baseline, 0.9) == pytest.approx(4.0)
    # baseline: 10 + (0.2 / 0.4) * 30 = 25; candidate: 5 + (0.1 / 0.3) * 5 = 6.667
    assert pareto.speedup(candidate, baseline, 0.7) == pytest.approx(25 / (5 + 5 / 3))
    assert pareto.speedup(candidate, baseline, 0.95) is None
    assert pareto.speedup([(5, 0.6)], baseline, 0.8) is None


def test_lowest_nfe_keeping_a_fraction_of_the_reference():
    kept = pareto.lowest_nfe_keeping_by_family(sample_rows(), reference_accuracy=0.90, keep=0.98)  # acc >= 0.882
    assert kept["eb-entropy"].nfe == 15.0 and kept["eb-entropy"].payload["sampler"]["gamma"] == 0.1
    assert kept["topk-confidence"].nfe == 81.0
    assert kept["oracle"].nfe == 20.0
    assert pareto.lowest_nfe_keeping(FRONT, 1.0, 0.98) is None


# ------------------------------------------------------------------------------------------------ rows


def test_family_derivation_for_old_rows():
    assert pareto.derive_family({"sampler": {"_target_": "mdmkit.samplers.EBSampler", "ordering": "entropy"}}) \
        == "eb-entropy"
    assert pareto.derive_family({"sampler": {"_target_": "mdmkit.samplers.TopKSampler", "ordering": "confidence",
                                             "k": 2}}) == "topk-confidence"
    assert pareto.derive_family({"sampler": {"_target_": "mdmkit.samplers.P2Sampler"}}) == "p2"
    assert pareto.derive_family({"sampler": {"_target_": "mdmkit.samplers.P2Sampler", "score": "confidence"}}) \
        == "p2-confidence"
    assert pareto.derive_family({"kind": "oracle", "sampler": {"name": "oracle", "reference": {}}}) == "oracle"
    assert pareto.derive_family({"family": "custom", "sampler": {"_target_": "x.EBSampler"}}) == "custom"


def test_load_rows_deduplicates_across_files_and_a_directory(tmp_path):
    old = row(None, 15.0, 0.80, gamma=0.1, time="2025-01-01T00:00:00")
    new = {**old, "accuracy": 0.85, "time": "2025-02-01T00:00:00"}
    other_seed = {**old, "seed": 7}
    keyed = {**row("topk-confidence", 41.0, 0.86, k=2), "key": "run-42"}
    train = {"kind": "train", "task": "sudoku", "time": "2025-01-01T00:00:00"}
    a = write_jsonl(tmp_path / "a.jsonl", [old, train, keyed])
    b = write_jsonl(tmp_path / "b.jsonl", [new, keyed])
    multirun = tmp_path / "multirun" / "sweep" / "12-00-00"
    write_jsonl(multirun / "0" / "results.jsonl", [old, {**keyed, "accuracy": 0.5, "time": "2024-01-01T00:00:00"}])
    write_jsonl(multirun / "1" / "nested" / "more.jsonl", [other_seed, new])
    (multirun / "1" / "notes.txt").write_text("not results")

    rows = pareto.load_rows([a, b, tmp_path / "multirun", a])
    assert len(rows) == 3
    by_seed = {r.get("seed"): r for r in rows if r["family"] == "eb-confidence"}
    assert by_seed[None]["accuracy"] == 0.85  # the latest of three copies
    assert by_seed[7]["accuracy"] == 0.80
    assert [r["accuracy"] for r in rows if r.get("key") == "run-42"] == [0.86]  # the older keyed copy lost
    assert all(r["kind"] == "evaluate" for r in rows)
    assert len(pareto.load_rows([a], kinds=None)) == 3  # train row kept when asked for every kind


def test_load_rows_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        pareto.load_rows([tmp_path / "missing.jsonl"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "evaluate", "family": "eb", "accuracy": 0.5, "nfe_mean": 3}\n{"kind": \n')
    with pytest.warns(UserWarning, match="bad.jsonl:2: skipping a torn results line"):
        assert len(pareto.load_rows([bad])) == 1  # a sweep killed mid-write: its whole rows still count


def test_select_rows_by_task_and_checkpoint():
    rows = [row("a", 1, 0.5), row("a", 2, 0.6, task="maze"), row("a", 3, 0.7, sha="fff0000111")]
    assert len(pareto.select_rows(rows, task="sudoku")) == 2
    assert len(pareto.select_rows(rows, task="sudoku", checkpoint="abc1234")) == 1
    assert len(pareto.select_rows(rows, checkpoint="sudoku_mdm.pt")) == 3


# ------------------------------------------------------------------------------------------ outputs


def test_plot_is_a_real_png(tmp_path):
    path = plot_fronts(sample_rows(), tmp_path / "plot" / "front.png", "sudoku: accuracy vs NFE",
                       baseline_family="topk-confidence")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_summary_table():
    table = pareto_tables.summary_table(sample_rows())
    lines = table.splitlines()
    assert lines[0].startswith("| family | runs | front points | best accuracy | NFE range | AUP |")
    assert len(lines) == 2 + 3
    eb = next(line for line in lines if line.startswith("| eb-entropy "))
    assert "| 4 | 3 | 0.9000 | 8.0–30.0 | — | 15.0 (acc 0.8900; gamma=0.1) |" in eb  # no tokens per step: no AUP
    with_parallelism = [{**r, "tokens_per_step": 48.0 / r["nfe_mean"]} for r in sample_rows()]
    expected = family_aup(with_parallelism, pareto.derive_family)["eb-entropy"]  # the table shows it to 0.1
    eb = next(line for line in pareto_tables.summary_table(with_parallelism).splitlines() if "| eb-entropy " in line)
    assert f"| 8.0–30.0 | {expected:.1f} |" in eb
    assert "oracle floor" in lines[-1]


def test_runs_table_lists_every_run_by_family_and_nfe():
    rows = [{**r, "cost_mean": r["nfe_mean"] + 1} for r in sample_rows()]
    lines = pareto_tables.runs_table(rows, cost=True).splitlines()
    assert lines[0].split() == ["family", "settings", "accuracy", "NFE", "cost"]
    assert len(lines) == 1 + len(rows)
    assert lines[1].split() == ["eb-entropy", "gamma=1.0", "0.6000", "8.00", "9.00"]
    assert lines[-1].split() == ["topk-confidence", "k=1", "0.9000", "81.00", "82.00"]
    assert "cost" not in pareto_tables.runs_table(rows).splitlines()[0]


def test_speedup_table_interpolates_along_both_fronts():
    lines = pareto_tables.speedup_table(sample_rows(), "topk-confidence", [0.86]).splitlines()
    assert lines[:3] == ["| family | acc 0.8600 |", "|---|---:|", "| topk-confidence NFE (baseline) | 41.0 |"]
    assert lines[3].startswith("| eb-entropy | ") and "vs 41.0)" in lines[3]


def test_reading_fronts_imports_neither_torch_nor_matplotlib():
    code = ("import sys, mdmkit.analysis.pareto_tables; "
            "print(sorted({'torch', 'matplotlib'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/pareto.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=WAIT_S, check=False)


def test_cli_writes_plot_page_and_rows(tmp_path):
    rows = sample_rows()
    first = write_jsonl(tmp_path / "one.jsonl", rows[:5] + [row("x", 5, 0.9, task="maze")])
    write_jsonl(tmp_path / "multirun" / "0" / "r.jsonl", rows[3:])  # overlaps the file by two rows
    out = tmp_path / "docs" / "sudoku_pareto"
    done = run_script(str(first), str(tmp_path / "multirun"), "--out", str(out), "--task", "sudoku",
                      "--baseline", "topk-confidence", "--keep", "0.98")
    assert done.returncode == 0, done.stderr
    assert "| eb-entropy |" in done.stdout
    assert (out.parent / "sudoku_pareto.png").read_bytes()[:4] == b"\x89PNG"
    page = (out.parent / "sudoku_pareto.md").read_text()
    assert "## Speedup over topk-confidence" in page and "scripts/pareto.py" in page and "--baseline" in page
    written = [json.loads(line) for line in (out.parent / "sudoku_pareto.jsonl").read_text().splitlines()]
    assert len(written) == len(rows)
    assert all(r["task"] == "sudoku" for r in written)


def test_a_cost_page_draws_cost_and_keeps_the_rows_as_recorded(tmp_path):
    rows = [{**r, "cost_mean": r["nfe_mean"] * 1.5} for r in sample_rows()]
    out = tmp_path / "cost_page"
    done = run_script(str(write_jsonl(tmp_path / "r.jsonl", rows)), "--out", str(out), "--task", "sudoku",
                      "--baseline", "topk-confidence", "--cost")
    assert done.returncode == 0, done.stderr
    page = out.with_suffix(".md").read_text()
    assert "| cost range |" in page and "topk-confidence cost (baseline)" in page and "NFE range" not in page
    assert "121.5" in page  # topk k=1 drawn at its cost, 1.5 x 81
    written = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert sorted(r["nfe_mean"] for r in written) == sorted(r["nfe_mean"] for r in rows)  # was: the cost


def test_cli_one_line_errors(tmp_path):
    results = write_jsonl(tmp_path / "r.jsonl", sample_rows())
    two = write_jsonl(tmp_path / "two.jsonl", [row("eb-entropy", 10, 0.5, sha="0123456789")])
    for args, message in (([str(tmp_path / "nope.jsonl")], "no such results file"),
                          ([str(results), "--task", "maze"], "no rows for task maze"),
                          ([str(results), "--baseline", "nothing"], "baseline family nothing"),
                          ([str(results), str(two)], "from 2 checkpoints")):
        done = run_script(*args, "--out", str(tmp_path / "out"), *([] if "--task" in args else ["--task", "sudoku"]))
        assert done.returncode == 2
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_rows_of_different_test_sets_are_not_put_on_one_front(tmp_path):
    """A quick `limit=` run or harder puzzles (`task.n_givens=`) in the same results file would move the fronts."""
    results = write_jsonl(tmp_path / "r.jsonl", sample_rows())  # rows from before `data` was stored: n alone
    fewer = write_jsonl(tmp_path / "fewer.jsonl", [{**row("topk-confidence", 21, 0.9, k=4), "n": 20}])
    assert run_script(str(results), "--task", "sudoku", "--out", str(tmp_path / "ok")).returncode == 0
    easy = [{**r, "test_set": "easy"} for r in sample_rows()]
    harder = write_jsonl(tmp_path / "harder.jsonl", [{**row("topk-confidence", 8, 1.0, k=9), "test_set": "hard"}])
    for files, message in (([results, fewer], "(n = 100, 20)"),
                           ([write_jsonl(tmp_path / "d.jsonl", easy), harder], "(2 different sets of examples")):
        done = run_script(*map(str, files), "--task", "sudoku", "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and "measured on different test sets " + message in done.stderr, done.stderr
    assert "pick one with --where test_set=easy --limit 100 (" in done.stderr  # the ways out, biggest first
    for chosen, choice, kept in (([results, fewer], ["--limit", "100"], len(sample_rows())),
                                 (files, ["--where", "test_set=hard"], 1)):
        done = run_script(*map(str, chosen), "--task", "sudoku", "--out", str(tmp_path / "chosen"), *choice)
        assert done.returncode == 0, done.stderr
        page = (tmp_path / "chosen.md").read_text()
        assert f"{kept} rows" in page and "Error bars: 95% Wilson score intervals of accuracy." in page
    done = run_script(str(results), "--task", "sudoku", "--out", str(tmp_path / "none"), "--where", "seed=7")
    assert done.returncode == 2 and "no rows of task sudoku pass --limit / --where" in done.stderr


def test_cli_compares_tagged_checkpoints_on_another_metric(tmp_path):
    mdm = [{**row("window-random", nfe, 0.0, sha="aaaaaaa111", window_param=1 / nfe), "spelling_accuracy": s}
           for nfe, s in ((4, 0.40), (8, 0.50), (16, 0.60))]
    spec = [{**row("speculative-random", nfe, 0.0, sha="bbbbbbb222", window_param=1 / nfe), "spelling_accuracy": s}
            for nfe, s in ((2, 0.40), (4, 0.50), (8, 0.60))]
    undefined = {**row("speculative-random", 1, 0.0, sha="bbbbbbb222", window_param=1.0), "spelling_accuracy": None}
    results = write_jsonl(tmp_path / "r.jsonl", [*mdm, *spec, undefined])
    out = tmp_path / "text"
    done = run_script(str(results), "--out", str(out), "--task", "sudoku", "--metric", "spelling_accuracy",
                      "--tag", "aaaaaaa=mdm", "--tag", "bbbbbbb=spec", "--baseline", "mdm: window-random")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "text.md").read_text()
    assert "| spec: speculative-random | 2.00× (5.6 vs 11.2) | 2.00× (6.8 vs 13.6) |" in page
    written = [json.loads(line) for line in (tmp_path / "text.jsonl").read_text().splitlines()]
    assert len(written) == 6 and {r["family"] for r in written} == {"mdm: window-random", "spec: speculative-random"}
    untagged = run_script(str(results), "--out", str(out), "--task", "sudoku", "--tag", "aaaaaaa=mdm")
    assert untagged.returncode == 2 and "matches 0 --tag options" in untagged.stderr



def test_a_tagged_page_redraws_from_its_own_rows(tmp_path):
    rows = [{**row("eb-confidence", nfe, acc, sha=sha, gamma=g), "preset": "eb"}  # a preset beyond the plain rule
            for sha in ("aaaaaaa111", "bbbbbbb222") for g, nfe, acc in ((0.1, 10, 0.8), (0.01, 20, 0.9))]
    tags = ["--tag", "aaaaaaa=a", "--tag", "bbbbbbb=b", "--task", "sudoku", "--baseline", "a: eb-confidence"]
    first = run_script(str(write_jsonl(tmp_path / "r.jsonl", rows)), "--out", str(tmp_path / "page"), *tags)
    assert first.returncode == 0, first.stderr
    again = run_script(str(tmp_path / "page.jsonl"), "--out", str(tmp_path / "again"), *tags)
    assert again.returncode == 0, again.stderr  # was: tagged twice, "b: eb (b: eb-confidence)"
    families = {json.loads(line)["family"] for line in (tmp_path / "again.jsonl").read_text().splitlines()}
    assert families == {"a: eb-confidence", "b: eb-confidence"}


def test_speculative_figure_draws_a_panel_per_rows_file(tmp_path):
    maze = write_jsonl(tmp_path / "maze.jsonl", [row("mdm: topk-confidence", 16, 0.55, k=1),
                                                 row("hybrid: speculative-confidence", 2.3, 0.70, k=2)])
    text = write_jsonl(tmp_path / "text.jsonl", [{**row("mdm: window-random", 4, 0.0), "spelling_accuracy": 0.4}])
    done = subprocess.run([sys.executable, "scripts/speculative_figure.py", f"{maze}:accuracy",
                           f"{text}:spelling_accuracy", "--out", str(tmp_path / "fig")],
                          cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    written = [json.loads(line) for line in (tmp_path / "fig.jsonl").read_text().splitlines()]
    assert [r["panel"] for r in written] == ["maze", "maze", "text"] and written[2]["accuracy"] == 0.0
    missing = subprocess.run([sys.executable, "scripts/speculative_figure.py", f"{tmp_path}/none.jsonl:accuracy",
                              "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, check=False,
                              timeout=WAIT_S)
    assert missing.returncode == 2 and "none.jsonl" in missing.stderr


def test_rules_page_refuses_rows_of_several_models(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join((ROOT / f"docs/results/rules_{task}.jsonl").read_text() for task in ("sudoku", "maze")))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/rules_page.py"), str(mixed), "--out",
                           str(tmp_path / "page")], capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode != 0 and "holds rows of 2 task(s) and 2 checkpoint(s)" in done.stderr
    assert not (tmp_path / "page.md").exists()

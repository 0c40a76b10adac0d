"""Results pages: the files of one output prefix, markdown tables, the command and provenance they carry."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mdmkit.analysis.pages import ROOT, Page, command_line, markdown_table, stamp


def test_page_writes_markdown_json_rows_and_figure(tmp_path):
    page = Page(tmp_path / "results" / "bench")  # the folder does not exist yet
    figure, ax = plt.subplots(figsize=(2, 1), dpi=50)
    ax.plot([1, 2], [3, 4])
    data = {"command": "python scripts/bench.py --quick", **stamp(), "speedup": 1.5}
    table = markdown_table(["sampler", "NFE"], [["top-k", "48.0"]], align="lr")
    written = page.write(markdown=["# Bench", "", f"- Reproduce: `{data['command']}`", "", table, ""],
                         data=data, rows=[{"b": 2, "a": 1}, {"c": "π"}], figure=figure)

    folder = tmp_path / "results"
    assert written == [folder / f"bench{suffix}" for suffix in (".png", ".json", ".jsonl", ".md")]
    assert (folder / "bench.md").read_text() == (
        "# Bench\n\n- Reproduce: `python scripts/bench.py --quick`\n\n"
        "| sampler | NFE |\n|---|---:|\n| top-k | 48.0 |\n")
    stored = json.loads((folder / "bench.json").read_text())
    assert stored["speedup"] == 1.5 and stored["command"] == data["command"]
    assert {"date", "machine", "git_commit", "versions"} <= set(stored)
    assert (folder / "bench.jsonl").read_text() == '{"a": 1, "b": 2}\n{"c": "\\u03c0"}\n'  # keys sorted
    assert (folder / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert not plt.fignum_exists(figure.number)  # written figures are closed
    assert page.name(".png") == "bench.png"


def test_page_writes_only_the_parts_given(tmp_path):
    assert Page(tmp_path / "only").write(markdown="# Only\n\n\n") == [tmp_path / "only.md"]
    assert (tmp_path / "only.md").read_text() == "# Only\n"  # exactly one final newline
    assert sorted(path.name for path in tmp_path.iterdir()) == ["only.md"]


def test_markdown_table_alignment_and_empty_cells():
    assert markdown_table(["", ""], [["NFE", 48], ["model", ""]]) == (
        "| | |\n|---|---|\n| NFE | 48 |\n| model | |")
    assert markdown_table(["a", "b", "c"], [], align="rc").splitlines()[1] == "|---:|:---:|---|"


def test_command_line_is_relative_to_the_repository_and_quoted():
    script = ROOT / "scripts" / "pareto.py"
    assert command_line(script, ["--title", "a b", "--out", "x"]) == (
        "python scripts/pareto.py --title 'a b' --out x")
    outside = Path("/elsewhere/run.py")
    assert command_line(outside, []) == "python /elsewhere/run.py"


def test_scripts_end_in_one_line_on_mdmkit_errors(capsys) -> None:
    from mdmkit.analysis.pages import positive_int, run_script
    from mdmkit.core.errors import CheckpointError

    def missing() -> None:
        raise CheckpointError("checkpoint not found: /nowhere.pt")

    with pytest.raises(SystemExit) as stopped:
        run_script(missing, "some_script.py")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "some_script.py: error: checkpoint not found: /nowhere.pt\n"
    assert positive_int("3") == 3
    with pytest.raises(ValueError):
        positive_int("0")

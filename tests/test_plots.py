"""Figures fit for a draft: a readable title, plain tick numbers on log axes, each front point labelled with its
swept value, families that coincide still told apart (marker, line style, transparency)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

from mdmkit.analysis import pareto
from mdmkit.analysis.pareto_plot import (
    draw_fronts,
    family_styles,
    log_nfe_axis,
    model_name,
    plot_fronts,
    plot_title,
)

matplotlib.use("Agg")  # no display: draw_fronts picks it too, the axis-helper test draws before it
ROOT = Path(__file__).resolve().parents[1]
SHA = "6f8fbec0bd1b9cba"
EB = {"_target_": "mdmkit.samplers.EBSampler", "ordering": "confidence", "block_length": None, "cache": "none"}
TOPK = {**EB, "_target_": "mdmkit.samplers.TopKSampler"}


def result(sampler: dict, nfe: float, accuracy: float, preset: str | None = None, **extra) -> dict:
    return {"kind": "evaluate", "task": "sudoku", "checkpoint": "checkpoints/sudoku_mdm.pt", "checkpoint_sha": SHA,
            "sampler": sampler, "accuracy": accuracy, "nfe_mean": nfe, "n": 200, "preset": preset,
            "accuracy_ci95": [accuracy - 0.02, accuracy + 0.02], **extra}


def swept_rows(nfes: tuple[float, ...] = (2.65, 4.0, 6.0, 9.0)) -> list[dict]:
    rows = [result({**EB, "gamma": g}, nfe, acc, "eb") for g, nfe, acc in zip((1.0, 0.1, 0.01, 0.001), nfes,
                                                                              (0.3, 0.5, 0.7, 0.8))]
    rows += [result({**TOPK, "k": k}, nfe + 0.3, acc, "topk") for k, nfe, acc in zip((8, 4, 2, 1), nfes,
                                                                                       (0.2, 0.45, 0.6, 0.75))]
    return rows


def tick_texts(fig) -> list[str]:
    """Every tick label of the first axes, as drawn."""
    fig.canvas.draw()
    ax = fig.axes[0]
    return [t.get_text() for t in (*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both"))]


def shown_x_labels(ax) -> list[str]:
    """The non-empty x tick labels inside the view (labels of ticks outside it are not drawn)."""
    ax.figure.canvas.draw()
    low, high = ax.get_xlim()
    labels = ax.get_xticklabels(which="both")
    return [t.get_text() for t in labels if t.get_text() and low <= t.get_position()[0] <= high]


def scientific(texts: list[str]) -> list[str]:
    return [t for t in texts if "times" in t or "×" in t or "^" in t or "e+" in t or "e-" in t]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("nfes", [(2.65, 4.0, 6.0, 9.0), (3.0, 30.0, 300.0, 900.0), (1.2, 1.4, 2.0, 3.6)])
def test_log_axis_ticks_are_plain_numbers(nfes):
    fig = draw_fronts(swept_rows(nfes), title="t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    texts = tick_texts(fig)
    assert not scientific(texts), texts
    visible = shown_x_labels(ax)
    assert len(visible) >= 2, visible  # a narrow range still gets numbers
    assert all(float(t) > 0 for t in visible)


def test_the_axis_helper_on_its_own_labels_a_narrow_range_plainly():
    fig, ax = plt.subplots()
    ax.plot([2.65, 3.3], [0, 1])
    log_nfe_axis(ax)
    ax.set_xlim(2.5, 3.5)
    assert not scientific(tick_texts(fig))
    labels = shown_x_labels(ax)
    assert len(labels) >= 2 and "3" in labels and all(float(t) > 0 for t in labels), labels


def test_every_front_point_is_labelled_with_its_swept_value():
    rows = swept_rows()
    fig = draw_fronts(rows, title="t")
    ax = fig.axes[0]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(["1.0", "0.1", "0.01", "0.001", "8", "4", "2", "1"])
    for annotation in ax.texts:  # small, next to a point that is on a front
        assert annotation.get_fontsize() < 8
        nfe, accuracy = annotation.xy
        assert any(p.nfe == nfe and p.accuracy == accuracy for front in pareto.fronts_by_family(rows).values()
                   for p in front)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "eb-confidence: gamma" in legend and "topk-confidence: k" in legend  # the legend says what is swept


def test_labels_can_be_switched_off_and_fixed_settings_go_to_the_legend():
    rows = [result({**EB, "gamma": 0.1, "block_length": 8}, nfe, acc, "eb") for nfe, acc in ((4, 0.5),)]
    fig = draw_fronts(rows, title="t")
    assert not fig.axes[0].texts
    assert "eb-confidence: block_length=8, gamma=0.1" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not draw_fronts(swept_rows(), title="t", annotate=False).axes[0].texts


def test_coinciding_families_stay_distinguishable():
    # two presets of one rule with identical results: the same front, drawn twice
    fast = {**EB, "_target_": "mdmkit.samplers.ThresholdSampler", "tau": 0.9}
    rows = [result({**fast, "tau": tau}, nfe, acc, "threshold") for tau, nfe, acc in ((0.5, 3, 0.4), (0.9, 9, 0.8))]
    rows += [result({**fast, "tau": tau, "block_length": 32}, nfe, acc, "fastdllm_threshold")
             for tau, nfe, acc in ((0.5, 3, 0.4), (0.9, 9, 0.8))]
    rows += swept_rows()
    fig = draw_fronts(rows, title="t")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}
    fronts = {name: line for name, line in lines.items() if name != "overall front"}
    assert len(fronts) == 4
    styles = [(line.get_marker(), line.get_linestyle()) for line in fronts.values()]
    assert len({marker for marker, _ in styles}) == len(styles)
    assert len(set(styles)) == len(styles)
    assert all(0 < line.get_alpha() < 1 for line in fronts.values())
    same = [line for name, line in fronts.items() if "threshold" in name]
    assert len(same) == 2 and list(same[0].get_xdata()) == list(same[1].get_xdata())
    assert same[0].get_linestyle() != same[1].get_linestyle()


def test_styles_stay_distinct_for_many_families():
    names = [f"family-{i}" for i in range(30)]
    styles = family_styles(names)
    assert len(set(styles.values())) == 30
    assert len({styles[n][0] for n in names[:12]}) == 12


def test_the_title_names_task_and_model_not_a_hash():
    rows = swept_rows()
    title = plot_title(rows, context="sweep rules_sudoku")
    assert title == "sudoku · sudoku_mdm: accuracy vs NFE (sweep rules_sudoku, 200 test examples)"
    assert SHA[:6] not in title
    fig = draw_fronts(rows)
    assert fig.axes[0].get_title() == plot_title(rows)
    assert model_name({"checkpoint": "GSAI-ML/LLaDA-8B-Instruct"}) == "GSAI-ML/LLaDA-8B-Instruct"
    assert model_name({"checkpoint": "/data/runs/2026-01-01/model.pt"}) == "model"
    assert model_name({"checkpoint_sha": SHA}) == f"checkpoint {SHA[:12]}"


def test_sample_figure_from_published_rows(tmp_path: Path):
    rows = pareto.load_rows([ROOT / "docs" / "results" / "rules_sudoku.jsonl"])
    fig = draw_fronts(rows, baseline_family="topk-confidence")
    ax = fig.axes[0]
    assert "sudoku" in ax.get_title() and "sudoku_mdm" in ax.get_title()
    fronts = pareto.fronts_by_family(rows)
    # every family of more than one run sweeps a setting there: each of its front points is labelled
    several = [name for name in fronts if sum(pareto.derive_family(r) == name for r in rows) > 1]
    assert len(ax.texts) == sum(len(fronts[name]) for name in several) > 20
    assert not scientific(tick_texts(fig))
    path = plot_fronts(rows, tmp_path / "rules.png", baseline_family="topk-confidence")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

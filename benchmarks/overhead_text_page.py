"""The text-model overhead page: one row per (network, rule), a bar chart against the 3% goal."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.overhead import GOAL
from benchmarks.overhead_text import TEXT_NETWORKS, TextCase
from mdmkit.analysis.pages import Page, markdown_table, stamp


def _spread(values: list[float], scale: float = 1.0) -> dict[str, Any]:
    scaled = [scale * v for v in values]
    return {"median": statistics.median(scaled), "min": min(scaled), "max": max(scaled), "per_trial": scaled}


def text_overhead_record(cases: list[TextCase], *, command: str, batch_size: int, steps: int,
                         note: str = "") -> dict[str, Any]:
    """Everything the page shows, as JSON: the command, machine, networks and one entry per case."""
    used = dict.fromkeys(case.network for case in cases)
    return {
        "command": command, **stamp(), "threads": torch.get_num_threads(), "goal": GOAL,
        "batch_size": batch_size, "steps_timed": steps, "note": note,
        "networks": {name: {"description": TEXT_NETWORKS[name].description, "prompt": TEXT_NETWORKS[name].prompt,
                            "answer": TEXT_NETWORKS[name].answer} for name in used},
        "cases": [{"network": c.network, "rule": c.rule, "overhead_ms": _spread(c.overhead, 1e3),
                   "forward_ms": _spread(c.forward, 1e3), "ratio": _spread(c.ratio)} for c in cases],
    }


def _cell(spread: dict[str, Any], scale: float = 1.0) -> str:
    return f"{scale * spread['median']:.2f} [{scale * spread['min']:.2f}-{scale * spread['max']:.2f}]"


def markdown(record: dict[str, Any], page: Page) -> list[str]:
    cases = record["cases"]
    met = sum(c["ratio"]["median"] <= record["goal"] for c in cases)
    lines = [
        "# Sampler overhead per step on text models",
        "",
        (f"The loop's own work per step (everything but the network's forward) as a share of one forward, at batch "
         f"{record['batch_size']}, float32, {record['threads']} torch threads. Goal: <= {record['goal']:.0%}. "
         f"**{met} of {len(cases)}** configurations meet it."),
        "",
        f"- Reproduce: `{record['command']}`",
        f"- Machine: {record['machine']}; torch {record['versions'].get('torch', '?')}; {record['date']}.",
        (f"- Method: each run goes through a clock between the forward counter and the network; a step's overhead is "
         f"the time from the end of one forward to the start of the next, so forward and overhead come from the same "
         f"seconds of the same run. The first {record['steps_timed']} steps of each run are timed (every row active, "
         f"every answer position masked: the most expensive steps); the median step is divided by the median forward "
         f"of the same run. Rules run in semi-autoregressive blocks of 32 (Dream's schedule over the whole answer), "
         f"confidence ordering unless named. Weights are random; prompts are random tokens of the stated length. "
         f"Data: `{page.name('.json')}`, chart: `{page.name('.png')}`."),
    ]
    if record.get("note"):
        lines.append(f"- Note: {record['note']}")
    lines += ["", "Networks:", ""]
    lines += [f"- `{name}`: {n['description']}; prompt {n['prompt']} + answer {n['answer']} tokens."
              for name, n in record["networks"].items()]
    rows = [[f"`{c['network']}`", c["rule"], _cell(c["overhead_ms"]), f"{c['forward_ms']['median']:.1f}",
             _cell(c["ratio"], 100), "yes" if c["ratio"]["median"] <= record["goal"] else "**no**"] for c in cases]
    lines += ["", markdown_table(["network", "rule", "overhead / step (ms)", "forward (ms)", "% of one forward",
                                  "goal met"], rows, "llrrrc"),
              "", "Values: median [min-max] over trials."]
    return lines


def figure(record: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = list(record["networks"])
    rules = list(dict.fromkeys(c["rule"] for c in record["cases"]))
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.22 * len(rules) * len(networks)), dpi=120)
    height = 0.8 / len(networks)
    for n, network in enumerate(networks):
        by_rule = {c["rule"]: c["ratio"]["median"] for c in record["cases"] if c["network"] == network}
        positions = [r + n * height for r in range(len(rules))]
        ax.barh(positions, [100 * by_rule.get(rule, 0.0) for rule in rules], height=height, label=network)
    ax.axvline(100 * record["goal"], color="black", linestyle="--", linewidth=1, label="goal")
    ax.set_yticks([r + 0.4 - height / 2 for r in range(len(rules))], rules)
    ax.set_xscale("log")  # shares span 0.1% to 100%
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.invert_yaxis()
    ax.set_xlabel(f"sampler work per step, % of one forward (batch {record['batch_size']})")
    ax.set_title("Sampler overhead on text models")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def write_text_overhead_page(page: Page, record: dict[str, Any]) -> list[Path]:
    return page.write(markdown=markdown(record, page), data=record, figure=figure(record))

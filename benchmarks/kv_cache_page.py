"""The KV-cache page (docs/results/kv_cache.*): the accuracy cost of `cache=prefix|dual` per sampler, read from
`evaluate.py` results rows, and their wall clock at equal NFE (`benchmarks.kv_cache_speed`).

Accuracy rows are compared within a setting (sampler, its knobs, block length): each cached row against the
`cache=none` row of the same setting. The interpretation lines are generated from the numbers, so they cannot
contradict them when the page is re-made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.kv_cache_speed import BLOCK, MODES, SPEED_MODES
from mdmkit.analysis.pages import Page, markdown_table, stamp
from mdmkit.io.naming import derive_family, sampler_settings

_CACHE_KEYS = ("cache", "cache_refresh")
_COLOURS = {"none": "tab:blue", "prefix": "tab:orange", "dual": "tab:green", BLOCK: "tab:red"}
_MARKERS = ("o", "s", "^", "D", "v", "P")


def setting(row: Mapping[str, Any]) -> tuple[str, str]:
    """The sampler (family without its cache) and the knobs of a row, cache fields left out."""
    sampler = {k: v for k, v in (row.get("sampler") or {}).items() if k not in _CACHE_KEYS}
    return derive_family({"sampler": sampler}), sampler_settings(sampler)


def cache_of(row: Mapping[str, Any]) -> str:
    return str((row.get("sampler") or {}).get("cache") or "none")


def accuracy_entries(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per row, sorted by sampler, setting and cache mode, with the accuracy change against the
    `cache=none` row of the same setting (None where that row is missing)."""
    entries = []
    for row in rows:
        family, knobs = setting(row)
        entries.append({"sampler": family, "setting": knobs, "cache": cache_of(row),
                        "block_length": (row.get("sampler") or {}).get("block_length"),
                        "cache_refresh": (row.get("sampler") or {}).get("cache_refresh"),
                        "accuracy": row["accuracy"], "accuracy_ci95": row.get("accuracy_ci95"), "n": row.get("n"),
                        "nfe_mean": row["nfe_mean"], "tokens_per_forward_mean": row.get("tokens_per_forward_mean"),
                        "computed_tokens_mean": row.get("computed_tokens_mean"), "key": row.get("key"),
                        "checkpoint": row.get("checkpoint"), "checkpoint_sha": row.get("checkpoint_sha")})
    order = {mode: i for i, mode in enumerate(MODES)}
    entries.sort(key=lambda e: (e["sampler"], e["block_length"] or 0, e["setting"], order.get(e["cache"], len(order))))
    plain = {(e["sampler"], e["setting"]): e["accuracy"] for e in entries if e["cache"] == "none"}
    for e in entries:
        reference = plain.get((e["sampler"], e["setting"]))
        e["accuracy_change"] = None if reference is None else e["accuracy"] - reference
    return entries


def _points(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f}"


def _number(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def accuracy_table(entries: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for e in entries:
        ci = e.get("accuracy_ci95") or [None, None]
        interval = "" if None in ci else f" ({100 * ci[0]:.1f}-{100 * ci[1]:.1f})"
        lines.append([e["sampler"], e["setting"], e["cache"], f"{100 * e['accuracy']:.1f}%{interval}",
                      _points(e["accuracy_change"]), f"{e['nfe_mean']:.2f}",
                      _number(e["tokens_per_forward_mean"], ".1f"), _number(e["computed_tokens_mean"], ".0f")])
    header = ["sampler", "setting", "cache", "accuracy (95% CI)", "vs none (points)", "NFE",
              "tokens / forward", "computed tokens"]
    return markdown_table(header, lines, align="lllrrrrr")


def speed_table(entries: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for e in entries:
        ms, speedup = e["ms_per_token"], e.get("speedup_over_none")
        ratio = "—" if speedup is None else (
            f"**{speedup['median']:.2f}x** ({speedup['min']:.2f}-{speedup['max']:.2f})")
        lines.append([e["batch"], e["mode"], f"{ms['median']:.2f} ({ms['min']:.2f}-{ms['max']:.2f})", ratio,
                      f"{100 * e['forward_share']:.0f}%", f"{e['nfe_per_row']:.0f}", f"{e['tokens_per_forward']:.1f}"])
    header = ["batch", "cache", "ms / generated token (range)", "speed-up over none (range)",
              "time in forwards", "NFE / row", "tokens / forward"]
    return markdown_table(header, lines, align="rlrrrrr")


def speed_goal_lines(entries: Sequence[Mapping[str, Any]], goal: float) -> list[str]:
    """One line per batch: does `dual` reach `goal` x the per-token speed of `none`, and what `prefix` reaches."""
    lines = []
    for batch in sorted({e["batch"] for e in entries}):
        by_mode = {e["mode"]: e for e in entries if e["batch"] == batch}
        if "dual" not in by_mode or "speedup_over_none" not in by_mode["dual"]:
            continue
        dual = by_mode["dual"]["speedup_over_none"]["median"]
        prefix = by_mode.get("prefix", {}).get("speedup_over_none", {}).get("median")
        verdict = "meets" if dual >= goal else "misses"
        lines.append(f"- batch {batch}: dual is {dual:.2f}x as fast as none per token ({verdict} the {goal:g}x goal)"
                     + ("" if prefix is None else f"; prefix {prefix:.2f}x") + ".")
        block = by_mode.get(BLOCK, {}).get("speedup_over_none", {}).get("median")
        if block is not None:
            lines.append(f"- batch {batch}: block diffusion (Fast-dLLM v2's decoding, exact cache) is {block:.2f}x as "
                         f"fast as none per token, {block / dual:.2f}x dual's, at the same NFE per row.")
    return lines


def loop_lines(entries: Sequence[Mapping[str, Any]], length: int) -> list[str]:
    """Where the time of the fastest masked-loop cache mode goes at the largest batch: forwards against the
    sampler loop."""
    entries = [e for e in entries if e["mode"] in MODES]
    if not entries:
        return []
    batch = max(e["batch"] for e in entries)
    fastest = min((e for e in entries if e["batch"] == batch), key=lambda e: e["ms_per_token"]["median"])
    line = (f"- At batch {batch}, `{fastest['mode']}` spends {100 * (1 - fastest['forward_share']):.0f}% of its time "
            f"outside the network, in the sampler loop (each step scores the logits of the block's columns only, "
            f"of the {length} positions).")
    return [line]


def accuracy_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The plain loop's accuracy range, each cache mode's accuracy changes, and how they compare with the
    rows' own 95% intervals."""
    plain = [e["accuracy"] for e in entries if e["cache"] == "none"]
    lines = [f"- Plain loop (`none`): {100 * min(plain):.1f}-{100 * max(plain):.1f}% over {len(plain)} settings."
             ] if plain else []
    for mode in MODES[1:]:
        cached = [e for e in entries if e["cache"] == mode and e["accuracy_change"] is not None]
        if not cached:
            continue
        worst = min(cached, key=lambda e: e["accuracy_change"])
        mean = sum(e["accuracy_change"] for e in cached) / len(cached)
        lines.append(f"- `{mode}`: accuracy change against `none` from {_points(worst['accuracy_change'])} points "
                     f"(worst: {worst['sampler']} {worst['setting']}) to "
                     f"{_points(max(e['accuracy_change'] for e in cached))}, mean {_points(mean)} over "
                     f"{len(cached)} settings.")
    changes = [abs(e["accuracy_change"]) for e in entries if e["cache"] != "none" and e["accuracy_change"] is not None]
    halves = [(e["accuracy_ci95"][1] - e["accuracy_ci95"][0]) / 2 for e in entries
              if e.get("accuracy_ci95") and None not in e["accuracy_ci95"]]
    if changes and halves:
        within = max(changes) < min(halves)
        lines.append(f"- The largest change, {100 * max(changes):.1f} points, is "
                     f"{'smaller' if within else 'not smaller'} than a row's 95% half-width "
                     f"({100 * min(halves):.1f}-{100 * max(halves):.1f} points): "
                     + ("the caches' accuracy cost is not resolved from noise at this test size." if within else
                        "some of the caches' cost exceeds a row's own noise."))
    return lines


def _accuracy_panels(axes: list[Any], accuracy: Sequence[Mapping[str, Any]]) -> None:
    """Accuracy (95% CI bars) against NFE and against computed tokens: colour = cache, marker = sampler, filled
    for the shortest block, hollow for longer ones."""
    samplers = sorted({e["sampler"] for e in accuracy})
    blocks = sorted({e["block_length"] for e in accuracy}, key=lambda b: (b is None, b or 0))
    for axis, key, label in ((axes[0], "nfe_mean", "NFE (forwards per example)"),
                             (axes[1], "computed_tokens_mean", "computed tokens per example")):
        for e in accuracy:
            if e.get(key) is None:
                continue
            colour = _COLOURS.get(e["cache"], "grey")
            ci = e.get("accuracy_ci95")
            if ci and None not in ci:
                axis.plot([e[key]] * 2, [100 * ci[0], 100 * ci[1]], color=colour, alpha=0.25, linewidth=1)
            axis.scatter(e[key], 100 * e["accuracy"], marker=_MARKERS[samplers.index(e["sampler"]) % len(_MARKERS)],
                         facecolors=colour if e["block_length"] == blocks[0] else "none", edgecolors=colour, s=36)
        axis.set_xscale("log")
        axis.set_xlabel(label + ", log scale")
        axis.set_ylabel("accuracy (%), 95% CI")
        axis.grid(True, which="both", alpha=0.25)
    for mode in MODES:
        axes[0].scatter([], [], color=_COLOURS[mode], label=f"cache={mode}")
    for i, name in enumerate(samplers):
        axes[0].scatter([], [], color="black", marker=_MARKERS[i % len(_MARKERS)], label=name)
    for block in blocks:
        axes[0].scatter([], [], facecolors="black" if block == blocks[0] else "none", edgecolors="black",
                        label=f"block_length={block}")
    axes[0].legend(fontsize=6, loc="lower right", ncol=2)
    axes[0].set_title("accuracy vs NFE", fontsize=9)
    axes[1].set_title("accuracy vs computed tokens", fontsize=9)


def _speed_panel(axis: Any, speed: Sequence[Mapping[str, Any]]) -> None:
    """ms per generated token per cache mode and batch: bars at the median, min-max whiskers."""
    batches = sorted({e["batch"] for e in speed})
    modes = [mode for mode in SPEED_MODES if any(e["mode"] == mode for e in speed)]
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        found = [next((e for e in speed if e["batch"] == b and e["mode"] == mode), None) for b in batches]
        xs = [i + (j - (len(modes) - 1) / 2) * width for i, e in enumerate(found) if e is not None]
        ms = [e["ms_per_token"] for e in found if e is not None]
        heights = [m["median"] for m in ms]
        errors = [[h - m["min"] for h, m in zip(heights, ms)], [m["max"] - h for h, m in zip(heights, ms)]]
        label = "block diffusion (exact cache)" if mode == BLOCK else f"cache={mode}"
        axis.bar(xs, heights, width, yerr=errors, color=_COLOURS[mode], label=label, capsize=3)
    axis.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    axis.set_ylabel("ms per generated token (median)")
    axis.set_title("wall clock at equal NFE (CPU)", fontsize=9)
    axis.legend(fontsize=7)
    axis.grid(True, axis="y", alpha=0.25)


def figure(accuracy: Sequence[Mapping[str, Any]], speed: Sequence[Mapping[str, Any]] | None) -> Any:
    """The accuracy panels (when there are rows), then the speed panel (when timed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (2 if accuracy else 0) + (1 if speed else 0)
    fig, axes = plt.subplots(1, max(1, panels), figsize=(4.6 * max(1, panels), 4.0), dpi=120, squeeze=False)
    axes = list(axes[0])
    if accuracy:
        _accuracy_panels(axes, accuracy)
    if speed:
        _speed_panel(axes[-1], speed)
    fig.tight_layout()
    return fig


def _speed_setup(speed: Mapping[str, Any]) -> str:
    setup, net = speed["setup"], speed["network"]
    block = (f" (block: `{setup['block_sampler']}`, block-causal attention, its commit forward the k-th of each "
             "block)") if "block_sampler" in setup else ""
    return (f"Timed by `{speed['command']}` ({speed['date']}). Network: `DiffusionLM` with LLaDA's settings and "
            f"random weights, {net['parameters'] / 1e6:.1f}M parameters (d_model {net['d_model']}, "
            f"{net['n_layers']} layers, {net['n_heads']} heads, SwiGLU "
            f"{net['mlp_hidden']}, vocabulary {net['vocab_size']}). Canvas: prompt {setup['prompt']} + answer "
            f"{setup['answer']} tokens; `{setup['sampler']}`: {setup['nfe_per_row']} forwards per row in every "
            f"mode{block}. {setup.get('dtype', 'float32')} on {setup.get('device', 'cpu')}, {speed['threads']} "
            "threads, `torch.no_grad`; a warm-up generation per mode, then "
            f"{setup['repeats']} rounds (each times one whole generation per batch and mode, modes rotated); "
            "median and range over rounds. Speed-up = none's time / this mode's within a round, median of rounds. "
            "Time in forwards: the network's share of the wall clock (the rest is the sampler loop).")


def kv_cache_page(page: Page, *, command: str, accuracy: list[dict[str, Any]], accuracy_source: Mapping[str, Any],
                  speed: Mapping[str, Any] | None, goal: float, notes: Sequence[str] = ()) -> tuple[list[str], dict]:
    """The markdown lines and the JSON record of `page`."""
    record = {"command": command, **stamp(), "accuracy": {**accuracy_source, "entries": accuracy},
              "speed": speed, "speed_goal": goal}
    rows_file = page.name(".jsonl")
    header = (f"Reproduce: `{command}` (commit {record['git_commit']}, {record['machine']}, {record['date']}). "
              f"Raw numbers and provenance: `{page.name('.json')}`; accuracy rows: `{rows_file}`; figure: "
              f"`{page.name('.png')}`. Caches: `sampler.cache=none|prefix|dual` (docs/samplers.md, \"KV caches for "
              "masked diffusion\").")
    md = ["# Approximate KV caches for masked diffusion: accuracy cost and wall clock", "", header, "",
          f"![accuracy vs cost, and ms per token]({page.name('.png')})", "", "## Accuracy cost of each cache", ""]
    if accuracy:
        md += [*accuracy_source.get("description", []), "", f"Commands (rows appended to `{rows_file}`):", "",
               "```bash", *accuracy_source.get("commands", []), "```", "", accuracy_table(accuracy), "",
               *accuracy_lines(accuracy), ""]
    else:
        md += [f"No accuracy rows yet (`{rows_file}` is empty or missing).", ""]
    md += ["## Wall clock per generated token at equal NFE", ""]
    if speed:
        md += [_speed_setup(speed), "", speed_table(speed["entries"]), "", *speed_goal_lines(speed["entries"], goal),
               *loop_lines(speed["entries"], speed["setup"]["prompt"] + speed["setup"]["answer"]),
               *([] if speed["setup"].get("device", "cpu") != "cpu" else
                 [("- GPU: not measured here (the issue's GPU goal is dual >= 3x none): on a GPU, `python -m "
                   "benchmarks.bench_cache --device cuda --dtype bfloat16 --out docs/results/kv_cache_gpu`.")]),
               ""]
    else:
        md += ["Not measured in this run.", ""]
    if notes:
        md += ["## Notes", "", *notes]
    return md, record


def write_kv_cache_page(page: Page, md: list[str], record: dict[str, Any], accuracy: list[dict[str, Any]],
                        speed: Mapping[str, Any] | None) -> list[Path]:
    """Write the page: markdown, JSON and the figure (when there is anything to draw)."""
    return page.write(markdown=md, data=record,
                      figure=figure(accuracy, speed["entries"] if speed else None) if accuracy or speed else None)

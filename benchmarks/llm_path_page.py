"""The page of `benchmarks.bench_llm_path`: tables per model and prompt, the goals checked, and a figure."""

from __future__ import annotations

from typing import Any

from benchmarks.llm_path import MODES
from mdmkit.analysis.pages import Page, markdown_table

GOALS = ("dual >= 3x the tokens/s of none at equal NFE (batch 1, prompt 512, answer 256; set on the LLaDA-8B shape)",
         "batch-1 dual (block-causal: block) forwards within 1.5x of their roofline",
         "the step loop within 1.2x of its forwards' time (loop share <= 1/6 of the wall clock)")


def _number(value: Any, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _speedups(cases: list[dict[str, Any]]) -> dict[tuple, float]:
    """tokens/s of each case over `none` at the same model, prompt and batch."""
    none = {(c["model"], c["prompt"], c["batch"]): c["tokens_per_s"] for c in cases
            if c["mode"] == "none" and "tokens_per_s" in c}
    ratios = {}
    for c in cases:
        same = (c["model"], c["prompt"], c["batch"])
        if "tokens_per_s" in c and same in none:
            ratios[(*same, c["mode"])] = c["tokens_per_s"] / none[same]
    return ratios


def _bounds(faster: dict[str, Any], none: dict[str, Any], predict: str | None) -> str:
    """What the rooflines allow for the ratio `faster` / `none`: here, and at the real size on the predicted card."""
    said = []
    for key, where in (("roofline_ms_per_forward", "the roofline here allows"),
                       ("predicted_ms_per_forward", f"at the real size in bf16 on the {predict} it allows")):
        if faster.get(key) and none.get(key):
            said.append(f"; {where} {none[key] / faster[key]:.2f}x")
    return "".join(said)


def goal_lines(cases: list[dict[str, Any]], model: str, predict: str | None = None) -> list[str]:
    """Each goal with the measured value on `model` at prompt 512 (the smallest prompt run, if 512 was not), beside
    what the roofline allows."""
    timed = [c for c in cases if c["model"] == model and "tokens_per_s" in c and c["batch"] == 1]
    if not timed:
        return ["- no batch-1 case was measured"]
    prompt = 512 if any(c["prompt"] == 512 for c in timed) else min(c["prompt"] for c in timed)
    by_mode = {c["mode"]: c for c in timed if c["prompt"] == prompt}
    lines = []
    if "none" in by_mode and "dual" in by_mode:
        ratio = by_mode["dual"]["tokens_per_s"] / by_mode["none"]["tokens_per_s"]
        lines.append(f"- {GOALS[0]}: **{ratio:.2f}x** ({'met' if ratio >= 3 else 'not met'}; prompt {prompt}"
                     f"{_bounds(by_mode['dual'], by_mode['none'], predict)})")
    if "dual" not in by_mode and "block" in by_mode and "none" in by_mode:  # block-causal: its exact cache instead
        ratio = by_mode["block"]["tokens_per_s"] / by_mode["none"]["tokens_per_s"]
        lines.append(f"- block-causal, so no approximate cache: block diffusion's exact cache gives **{ratio:.2f}x** "
                     f"the tokens/s of none at equal NFE (batch 1, prompt {prompt}"
                     f"{_bounds(by_mode['block'], by_mode['none'], predict)})")
    if "canvas" in by_mode:
        lines += _canvas_lines(by_mode["canvas"], prompt)
    dual = by_mode.get("dual") or by_mode.get("block")
    if dual is not None and dual.get("forward_over_roofline") is not None:
        over = dual["forward_over_roofline"]
        lines.append(f"- {GOALS[1]}: **{over:.2f}x** ({'met' if over <= 1.5 else 'not met'})")
    elif dual is not None:
        lines.append(f"- {GOALS[1]}: no roofline figures for this device")
    if dual is not None:
        whole = 1 / (1 - dual["loop_share"])
        lines.append(f"- {GOALS[2]}: **{whole:.2f}x** ({'met' if whole <= 1.2 else 'not met'})")
    return lines


def _canvas_lines(case: dict[str, Any], prompt: int) -> list[str]:
    """A canvas network's batch-1 case: its decoder forwards and its encoder pass, each beside its roofline."""
    over, encoder = case.get("forward_over_roofline"), case.get("encoder_roofline_ms")
    lines = [f"- canvas decoder forwards (batch 1, prompt {prompt}): {case['ms_per_forward']:.2f} ms each"
             + (f", **{over:.2f}x** their roofline" if over is not None else ""),
             f"- the encoder's pass over the prompt (filling the cache): {case['encoder_ms']:.1f} ms"
             + (f" (roofline {encoder:.2f} ms)" if encoder is not None else "")]
    whole = 1 / (1 - case["loop_share"])
    return lines + [f"- {GOALS[2]}: **{whole:.2f}x** ({'met' if whole <= 1.2 else 'not met'})"]


def _header(record: dict[str, Any], figure_name: str) -> list[str]:
    setup = record["setup"]
    active = record.get("active_parameters", {})
    networks = ", ".join(
        f"{name} ({count / 1e9:.2f}B parameters"
        + (f", {active[name] / 1e9:.2f}B active per token)" if active.get(name, count) < count else ")")
        for name, count in record["parameters"].items())
    nfe = setup["answer"] // setup["block"] * setup["steps_per_block"]
    roofline = record["hardware"] or "none (no figures for this device)"
    commit = str(record.get("git_commit", ""))[:12]
    return [f"# The LLM path at real size: {record['device']}", "",
            f"Made by `{record['command']}` on {record['date']} (commit {commit}).", "",
            (f"Networks: {networks}, mdmkit's `DiffusionLM` (DiffusionGemma: transformers' network) with seeded "
             f"random {setup['dtype']} weights made on the device. Every mode runs {setup['steps_per_block']} "
             f"forwards per block of {setup['block']}: equal NFE ({nfe} per row) unless said below; `block` is block "
             "diffusion on the same weights attending block-causally. "
             f"Roofline: {roofline}; each forward's time is max(bytes of weights, activations and KV read / "
             "bandwidth, FLOPs / peak rate), term by term (`benchmarks/llm_roofline.py`)."), "",
            *[f"- {model}: {how}" for model, how in record.get("decoding", {}).items()],
            *([""] if record.get("decoding") else []),
            f"![tokens/s and forward time against the roofline]({figure_name})", ""]


def llm_path_markdown(record: dict[str, Any], cases: list[dict[str, Any]], rules: list[dict[str, Any]],
                      figure_name: str) -> list[str]:
    setup = record["setup"]
    lines = _header(record, figure_name)
    predict = setup.get("predict")
    bound = f"{predict} bf16 bound tokens/s"
    if predict:
        lines += [(f"The last column is what the roofline allows the same forwards at the network's real size in bf16 "
                   f"on the {predict} ({setup['answer']} answer tokens x batch / the forwards' roofline time)."), ""]
    made = list(record["parameters"])  # then any model that could not be made here (its error row)
    for model in made + [m for m in dict.fromkeys(c["model"] for c in cases) if m not in made]:
        lines += [f"## {model}", "", "Goals:", *goal_lines(cases, model, predict), ""]
        for prompt in sorted({c["prompt"] for c in cases if c["model"] == model}):
            rows = [c for c in cases if c["model"] == model and c["prompt"] == prompt]
            speedups = _speedups(rows)
            table = []
            for c in sorted(rows, key=lambda c: (c["batch"], MODES.index(c["mode"]))):
                if "error" in c:
                    table.append([c["batch"], c["mode"], c["error"], *[""] * (7 if predict else 6)])
                    continue
                table.append([c["batch"], c["mode"], _number(c["tokens_per_s"], 1),
                              _number(speedups.get((model, prompt, c["batch"], c["mode"]))),
                              _number(c["ms_per_forward"]), _number(c.get("roofline_ms_per_forward")),
                              _number(c["loop_share"]), _number(c.get("loop_syncs_per_forward"), 1),
                              _number(c["peak_gib"], 1)]
                             + ([_number(c.get("predicted_tokens_per_s"), 0)] if predict else []))
            header = ["batch", "cache", "tokens/s", "x none", "ms/forward", "roofline ms", "loop share",
                      "host syncs/forward", "peak GiB", *([bound] if predict else [])]
            lines += [f"Prompt {prompt}, answer {setup['answer']}:", "",
                      markdown_table(header, table, "rl" + "r" * (len(header) - 2)), ""]
    if rules:
        lines += ["## Sampler overhead per rule", "",
                  ("One block of answer tokens after the first prompt length, cache as given: the loop share is "
                   "the wall clock outside the network's forwards."), ""]
        table = [[r["rule"], r["batch"], r.get("cache", ""), r.get("error") or _number(r["loop_share"]),
                  _number(r.get("forwards")), _number(r.get("loop_syncs_per_forward"), 1)] for r in rules]
        lines += [markdown_table(["rule", "batch", "cache", "loop share", "forwards", "host syncs/forward"], table,
                                 "lrlrrr"), ""]
    lines += [("Host syncs are counted on a separate untimed generation (the counting wraps tensor methods); they "
               "are the calls that would make Python wait for the GPU: `.item()`, `.tolist()`, `.cpu()`, "
               "`bool/int/float` of a tensor, `nonzero`, `torch.equal`."), ""]
    lines += [f"- {note}" for note in record.get("notes", [])]
    return lines


def llm_path_figure(cases: list[dict[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [c for c in cases if "tokens_per_s" in c]
    series = sorted({(c["model"], c["prompt"]) for c in timed})
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    for model, prompt in series:
        for mode, style in (("none", ":"), ("prefix", "--"), ("dual", "-"), ("block", "-."), ("canvas", "-")):
            points = sorted((c["batch"], c["tokens_per_s"], c["ms_per_forward"], c.get("roofline_ms_per_forward"))
                            for c in timed if (c["model"], c["prompt"], c["mode"]) == (model, prompt, mode))
            if not points:
                continue
            label = f"{model} p{prompt} {mode}"
            left.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
            right.plot([p[0] for p in points], [p[2] for p in points], style, marker="o", label=label)
            if all(p[3] is not None for p in points) and mode in ("dual", "canvas"):
                right.plot([p[0] for p in points], [p[3] for p in points], style, color="grey", alpha=0.6,
                           label=f"{label} roofline")
    for axis, title in ((left, "tokens/s (equal NFE)"), (right, "ms per forward")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("batch")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    if timed:
        left.legend(fontsize=6)
        right.legend(fontsize=6)
    figure.tight_layout()
    return figure


def write_llm_path_page(page: Page, record: dict[str, Any], cases: list[dict[str, Any]],
                        rules: list[dict[str, Any]]) -> list:
    markdown = llm_path_markdown(record, cases, rules, page.name(".png"))
    return page.write(markdown=markdown, data={**record, "cases": cases, "rules": rules},
                      figure=llm_path_figure(cases))

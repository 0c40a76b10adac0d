"""Results to wandb: each evaluation run logs its rows as a table, an accuracy-vs-NFE chart and AUP per family.

Offline by default (never needs or waits on a network; `wandb sync` later, or `wandb.mode=online`), and the
run is always finished in a `finally`, so one failed job never leaves a multirun hanging.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mdmkit.analysis.aup import family_aup
from mdmkit.io.naming import derive_family, row_label

# family: with its preset where that is more than the rule's plain option; label: family and settings, as printed
COLUMNS = ["family", "preset", "label", "sampler", "accuracy", "ci95_low", "ci95_high", "nfe_mean", "nfe_median",
           "nfe_to_stop_mean", "tokens_per_step", "cost_mean", "wall_time_s", "kind"]


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for row in rows:
        params = {k: v for k, v in row["sampler"].items() if k != "_target_"}
        low, high = row.get("accuracy_ci95") or (None, None)
        out.append([derive_family(row), row.get("preset"), row_label(row), json.dumps(params, sort_keys=True),
                    row["accuracy"], low, high, row["nfe_mean"],
                    row.get("nfe_median"), row.get("nfe_to_stop_mean"), row.get("tokens_per_step"),
                    row.get("cost_mean"), row.get("wall_time_s"), row["kind"]])
    return out


def log_rows(rows: list[dict[str, Any]], settings: dict[str, Any] | None, output_dir: Path | None,
             name: str, plot: Path | None = None) -> None:
    """Log `rows` to one wandb run (nothing if `settings` is empty or mode is 'disabled')."""
    if not rows or not settings or settings.get("mode", "offline") == "disabled":
        return
    import wandb

    run = wandb.init(project=settings.get("project", "mdmkit"), mode=settings.get("mode", "offline"),
                     group=settings.get("group"), name=name, job_type="evaluate",
                     dir=str(output_dir) if output_dir else None, config={"rows": len(rows)})
    try:
        table = wandb.Table(columns=list(COLUMNS), data=table_rows(rows))
        logged = {"results": table,
                  "accuracy_vs_nfe": wandb.plot.scatter(table, "nfe_mean", "accuracy",
                                                        title=f"{name}: accuracy vs NFE")}
        aups = family_aup(rows, derive_family)  # the families whose rows record tokens per step
        if aups:
            logged["aup_by_family"] = wandb.Table(columns=["family", "aup"], data=[list(item) for item in aups.items()])
        if plot is not None and plot.exists():
            logged["pareto"] = wandb.Image(str(plot))
        run.log(logged)
    finally:
        run.finish()

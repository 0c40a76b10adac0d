"""What a training run did over all its calls, and the summary it closes with.

A run resumed by its directory is trained by several calls of `fit`; each appends a line to the directory's
`calls.jsonl` (its seconds, the step it started at and reached, its validation losses). The run's training time
and its validation losses are read back from there, so the summary at the end of a resumed call speaks of the
whole run, not of its last leg. A call that went back to an earlier checkpoint replaces the losses logged after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from mdmkit.core.wording import plural
from mdmkit.io.results import read_records

CALLS_FILE = "calls.jsonl"  # in a run directory: one line per call of `fit`
VAL_LOSS = "val/loss"


class ValidationLosses(Callback):
    """The validation losses of this call, by the global step they were measured at, and the step it started at."""

    def __init__(self) -> None:
        self.first_step = 0
        self.losses: list[tuple[int, float]] = []

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.first_step = trainer.global_step

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        loss = trainer.callback_metrics.get(VAL_LOSS)
        if loss is not None and not trainer.sanity_checking:
            self.losses.append((trainer.global_step, float(loss)))

    def record(self) -> dict[str, Any]:
        """This call's part of its line in `calls.jsonl`."""
        return {"first_step": self.first_step, "validation": [list(point) for point in self.losses]}


@dataclass(frozen=True)
class RunHistory:
    """A run's calls as `calls.jsonl` holds them: their training time, and the validation losses by step."""

    seconds: float
    calls: int
    losses: tuple[tuple[int, float], ...]

    @classmethod
    def read(cls, run_dir: Path) -> RunHistory:
        calls = read_records(run_dir / CALLS_FILE)
        losses: dict[int, float] = {}
        for call in calls:
            first = int(call.get("first_step", 0))
            losses = {step: loss for step, loss in losses.items() if step <= first}
            losses.update({int(step): float(loss) for step, loss in call.get("validation", [])})
        return cls(sum(float(call["seconds"]) for call in calls), len(calls), tuple(sorted(losses.items())))

    def validation(self) -> str | None:
        """"val loss 1.234 at step 300 (best), 1.250 at step 400 (last)", or None before any validation."""
        if not self.losses:
            return None
        best = min(self.losses, key=lambda point: point[1])
        last = self.losses[-1]
        if best == last:
            return f"val loss {last[1]:.4f} at step {last[0]} (best and last)"
        return f"val loss {best[1]:.4f} at step {best[0]} (best), {last[1]:.4f} at step {last[0]} (last)"


def closing_summary(steps: int, history: RunHistory, where: dict[str, str]) -> str:
    """The lines a run ends with: its steps, its training time over all its calls, its best and last validation
    loss, and where its results are (`where`: what -> path, in order)."""
    minutes = f"{history.seconds / 60:.1f} min of training over {plural(history.calls, 'call')}"
    head = f"done: {plural(steps, 'step')}, {minutes}"
    validation = history.validation()
    lines = [head + (f" | {validation}" if validation else "")]
    lines += [f"  {what}: {path}" for what, path in where.items()]
    return "\n".join(lines)

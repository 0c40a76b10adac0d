"""`train.py experiment=sudoku_indicator`: record base trajectories, train the NI indicator, evaluate NI.

The run writes `indicator.pt` (the indicator tied to its base network) next to Lightning's checkpoints, then
evaluates the configured NI sampler with it on the test split, as `run_training` does for an MDM.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mdmkit.core.devices import resolve_device
from mdmkit.evaluation.evaluate import evaluate_test_split, format_summary
from mdmkit.io.indicator import save_indicator
from mdmkit.io.results import append_record
from mdmkit.models.indicator import num_parameters
from mdmkit.training.indicator.data import TrajectoryDataModule
from mdmkit.training.indicator.module import IndicatorModule
from mdmkit.training.preflight import TrainingPlan
from mdmkit.training.train import fit, ran_fast_dev_run, seed_run

# the frozen base network stays in eval mode on purpose
warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")


def run_indicator_training(plan: TrainingPlan, output_dir: Path,
                           on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    config, run, data = plan.config, plan.run, plan.data
    seed_run(run)
    module = IndicatorModule(config)
    datamodule = TrajectoryDataModule(module.trajectories, module.task, data.batch_size, data.eval_batch_size,
                                      data.val_examples, run.seed, data.workers)
    size = num_parameters(module.indicator)
    share = size / num_parameters(module.base)
    banner = (f"indicator: {size / 1e3:.1f}k parameters ({share:.3f} of the base network) | "
              f"base: {module.trajectories.checkpoint}")
    trainer, train_time = fit(plan, module, datamodule, output_dir, banner, on_start)
    summary: dict[str, Any] = {"train_time_s": train_time, "global_step": trainer.global_step, "share": share}
    if trainer.global_rank != 0:
        return summary

    path = output_dir / "indicator.pt"
    extra = {"base_checkpoint": module.trajectories.checkpoint, "config": config, "train_summary": summary}
    save_indicator(module.indicator, module.base, path, extra=extra)
    if run.evaluate_after_training and not ran_fast_dev_run(trainer):
        module.eval().to(resolve_device(run.device))
        result = evaluate_test_split(module.base, module.task, module.sampler, run.eval_limit, data.eval_batch_size,
                                     run.seed)
        summary.update(result.summary())
        sampler = {**config["sampler"], "indicator": str(path)}
        append_record(run.results_file, {"kind": "indicator", "checkpoint": module.trajectories.checkpoint,
                                         "indicator": str(path), "task": module.task.name, "sampler": sampler,
                                         **summary, "config": config})
        print(f"[{module.task.name}] indicator: {trainer.global_step} steps in {train_time / 60:.1f} min"
              f" | NI epsilon={module.sampler.epsilon}: {format_summary(result.summary())}"
              f" | cost {summary['cost_mean']:.2f}")
    return summary

"""Console entry points (`mdmkit-train`, `mdmkit-evaluate`, `mdmkit-lm-eval`; `train.py`/`evaluate.py` at the root).

Each checks its command line, hands it to Hydra (or lm-eval), and runs the job its config asks for. Around them:
`process` (the process's set-up, a failure as one line), `overrides` (checks of the command line),
`failed_jobs` (a multirun's failures, listed at its end) and `harness` (lm-eval's command line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mdmkit.cli import harness
from mdmkit.cli.overrides import (
    check_known_keys,
    check_sweep_overrides,
    check_task_named,
    names_sampler,
    task_fields,
)
from mdmkit.cli.process import command_line, contained, refused_in_one_line, set_up_process
from mdmkit.training.resume import ResumePlan, is_rank_zero, plan_resume

_CONFIGS = "pkg://mdmkit.conf"


def train() -> None:
    """`train.py [key=value ...]`. With `ckpt_path=<run directory or a checkpoint in its checkpoints/>` the run
    goes on in its directory with its saved config, the overrides given now on top (see training/resume.py)."""
    set_up_process()
    resume = refused_in_one_line(plan_resume)
    if resume is None:
        refused_in_one_line(lambda argv: check_known_keys("train", argv))

    @hydra.main(version_base="1.3", config_path=_CONFIGS, config_name="train")
    def job(cfg: DictConfig) -> None:
        _train(cfg, resume)

    if resume is None:
        job()
    else:
        with command_line(resume.argv):  # the run's own overrides, today's on top, its directory
            job()


def _resumed(cfg: DictConfig, resume: ResumePlan) -> tuple[DictConfig, Callable[[], None] | None]:
    """The resumed run's config, and what records it in its directory once training starts (rank 0)."""
    from hydra import compose

    config = resume.config(cfg, lambda overrides: compose(config_name="train", overrides=overrides))
    hydra_node = HydraConfig.get()
    return config, (lambda: resume.record(config, hydra_node)) if is_rank_zero() else None


def _train(cfg: DictConfig, resume: ResumePlan | None) -> None:
    # the plan (every check), then heavy imports: a bad value stops before Lightning loads (seconds)
    from mdmkit.training.preflight import plan_training

    with contained():
        cfg, on_start = _resumed(cfg, resume) if resume is not None else (cfg, None)
        plan = plan_training(cfg, preset=_preset())
        if plan.kind == "indicator":
            from mdmkit.training.indicator.train import run_indicator_training as run
        elif plan.kind == "sft":
            from mdmkit.training.sft.train import run_sft as run
        elif plan.kind == "rl":
            from mdmkit.training.rl.train import run_rl_training as run
        else:
            from mdmkit.training.train import run_training as run
        run(plan, Path(HydraConfig.get().runtime.output_dir), on_start=on_start)


def evaluate() -> None:
    """`evaluate.py [key=value ...]`; with `-m`, exits with status 2 after the sweep if any of its jobs failed."""
    set_up_process()
    refused_in_one_line(check_task_named)
    refused_in_one_line(lambda argv: check_known_keys("evaluate", argv))
    _evaluate()


@hydra.main(version_base="1.3", config_path=_CONFIGS, config_name="evaluate")
def _evaluate(cfg: DictConfig) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    hydra_config = HydraConfig.get()
    output_dir = Path(hydra_config.runtime.output_dir)
    overrides = list(hydra_config.overrides.task)
    with contained():
        check_sweep_overrides(cfg, overrides)
        plan = plan_evaluation(cfg, preset=_preset(), task_fields=task_fields(overrides),
                               sampler_named=names_sampler(overrides))
        rows = run_evaluation(plan, output_dir)
        if hydra_config.mode == RunMode.MULTIRUN:
            _save_rows(rows, output_dir)


def _preset() -> str | None:
    """The sampler option the running job was composed with (`sampler=llada`: "llada"), from Hydra's
    `runtime.choices`: rows name it beside their key, which the config alone cannot tell."""
    choice = HydraConfig.get().runtime.choices.get("sampler")
    return str(choice) if choice else None


def _save_rows(rows: list[dict[str, Any]], output_dir: Path) -> None:
    """A copy of the run's rows (new and resumed) in its Hydra directory, so that `scripts/pareto.py multirun/...`
    finds a multirun's rows under it (results_file is where every run appends them, usually outside)."""
    if rows:
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(output_dir / "rows.jsonl", "w") as file:
            file.writelines(json.dumps(row) + "\n" for row in rows)


def lm_eval() -> None:
    """lm-eval's own command line with the `mdmkit` model registered and mdmkit's task configs (`mdmkit_gsm8k`,
    `mdmkit_humaneval`, `mdmkit_mbpp`) on the include path. Logged samples carry each generation's NFE; a bad
    `model_args` value ends with one line and status 2."""
    from lm_eval.__main__ import cli_evaluate

    from mdmkit.evaluation.distributed import leave_process_group

    set_up_process()
    harness.register_model()
    argv = refused_in_one_line(harness.checked_arguments)
    with command_line(argv), harness.nfe_in_samples():
        refused_in_one_line(lambda _: cli_evaluate())
    leave_process_group()  # a data-parallel run (the mdmkit model joined torchrun's group)

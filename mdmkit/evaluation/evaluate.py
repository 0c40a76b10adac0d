"""`evaluate.py ckpt=... [task=...] sampler=...`: sample the test split and record accuracy and NFE."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from mdmkit.checkpoint import TrainedModel
from mdmkit.config import build, require, to_container
from mdmkit.evaluation.results import append_record
from mdmkit.evaluation.runner import EvalResult, sample_split
from mdmkit.samplers import MaskedSampler
from mdmkit.tasks.base import PuzzleTask


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def evaluate_test_split(
    network: torch.nn.Module,
    task: PuzzleTask,
    sampler: MaskedSampler,
    limit: int | None,
    batch_size: int,
    seed: int,
    oracle: bool = False,
) -> EvalResult:
    test = task.load_splits()["test"].head(limit)
    return sample_split(network, task, test, sampler, batch_size=batch_size, seed=seed, progress=True, oracle=oracle)


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"accuracy {summary['accuracy']:.4f} on {summary['n']} test examples | "
        f"NFE mean {summary['nfe_mean']:.2f} (p50 {summary['nfe']['p50']:.0f}, max {summary['nfe']['max']}) | "
        f"{summary['wall_time_s']:.1f} s"
    )


def run_evaluation(cfg: DictConfig) -> dict[str, Any]:
    require(cfg.ckpt is not None, "ckpt=... is required: a Lightning .ckpt or a slim model.pt")
    trained = TrainedModel(cfg.ckpt)
    task = build(cfg.task, "task") if cfg.get("task") is not None else trained.task
    sampler = build(cfg.sampler, "sampler")
    require(cfg.batch_size >= 1, f"batch_size={cfg.batch_size} must be >= 1")
    require(cfg.limit is None or cfg.limit >= 1, f"limit={cfg.limit} must be >= 1 or null")
    network = trained.network(task).to(resolve_device(cfg.device))
    result = evaluate_test_split(network, task, sampler, cfg.limit, cfg.batch_size, cfg.seed, cfg.oracle)
    summary = result.summary()
    common = {"checkpoint": str(trained.path), "weights": "ema", "task": task.name}
    context = {"config": to_container(cfg), "train_config": trained.config}
    record = {"kind": "evaluate", **common, "sampler": to_container(cfg.sampler), **summary, **context}
    path = append_record(cfg.results_file, record)
    print(f"[{task.name}] {format_summary(summary)} -> {path}")
    if result.oracle_nfe is not None:
        # the floor as a sampler of its own, so fronts and tables can draw it beside the real samplers
        floor = {**summary, "nfe_mean": summary["oracle_nfe_mean"], "nfe": summary["oracle_nfe"],
                 "cost_mean": summary["oracle_nfe_mean"], "wall_time_s": None}
        oracle_record = {"kind": "oracle", **common,
                         "sampler": {"name": "oracle", "reference": to_container(cfg.sampler)}, **floor, **context}
        append_record(cfg.results_file, oracle_record)
        print(f"[{task.name}] oracle floor of this trajectory: NFE mean {summary['oracle_nfe_mean']:.2f} "
              f"(same outputs, accuracy {summary['accuracy']:.4f})")
    return record

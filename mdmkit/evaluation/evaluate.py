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
) -> EvalResult:
    test = task.load_splits()["test"].head(limit)
    return sample_split(network, task, test, sampler, batch_size=batch_size, seed=seed, progress=True)


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
    result = evaluate_test_split(network, task, sampler, cfg.limit, cfg.batch_size, cfg.seed)
    summary = result.summary()
    record = {
        "kind": "evaluate",
        "checkpoint": str(trained.path),
        "weights": "ema",
        "task": task.name,
        "sampler": to_container(cfg.sampler),
        **summary,
        "config": to_container(cfg),
        "train_config": trained.config,
    }
    path = append_record(cfg.results_file, record)
    print(f"[{task.name}] {format_summary(summary)} -> {path}")
    return record

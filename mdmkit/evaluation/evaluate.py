"""`evaluate.py ckpt=... [task=...] sampler=...|sweep=...`: sample the test split, record accuracy and NFE.

One sampler per run (Hydra multirun sweeps over them), or a whole grid (`sweep=...`) on one loaded model.
Rows whose key is already in the results file are skipped, so a killed sweep resumes where it stopped.
Under `torchrun --nproc_per_node=N` (or the N tasks of a SLURM job) every split is sharded across the processes
and rank 0 writes the same rows a single process would (`distributed.py`), with `world_size` beside them.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mdmkit.analysis.pareto_plot import plot_fronts, plot_title
from mdmkit.analysis.pareto_tables import runs_table
from mdmkit.core.config import build, require, require_bool, require_int, to_container
from mdmkit.core.devices import resolve_device
from mdmkit.core.progress import progress_bar
from mdmkit.evaluation.distributed import Ranks, init_ranks
from mdmkit.evaluation.generation import check_decoder, check_trained_for
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.runner import EvalResult, sample_split
from mdmkit.evaluation.sweep import SweepJob, chosen_preset, expand
from mdmkit.evaluation.text_eval import evaluate_text_task, load_text_model, model_fingerprint, parameter_counts
from mdmkit.evaluation.tracking import log_rows
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.naming import derive_family, row_label
from mdmkit.io.results import (
    append_record,
    check_writable,
    evaluation_key,
    file_fingerprint,
    provenance,
    read_records,
)
from mdmkit.models.llm.registry import model_kind
from mdmkit.samplers import Sampler
from mdmkit.tasks.base import PuzzleTask
from mdmkit.tasks.text import TextTask


def evaluate_test_split(
    network: torch.nn.Module,
    task: PuzzleTask,
    sampler: Sampler,
    limit: int | None,
    batch_size: int,
    seed: int,
) -> EvalResult:
    test = task.load_test().head(limit)
    result = sample_split(network, task, test, sampler, batch_size=batch_size, seed=seed, progress=True)
    assert result is not None  # one process: the whole result
    return result


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"accuracy {summary['accuracy']:.4f} on {summary['n']} test examples | "
        f"NFE mean {summary['nfe_mean']:.2f} (p50 {summary['nfe']['p50']:.0f}, max {summary['nfe']['max']}) | "
        f"{summary['wall_time_s']:.1f} s"
    )


class _Rows:
    """Builds results rows for one (model, task) pair: keys, provenance and shared context."""

    def __init__(self, cfg: DictConfig, checkpoint: str, checkpoint_sha: str, task_name: str, data: dict,
                 test_set: str, weights: str, train_config: dict | None, ranks: Ranks) -> None:
        # batch_size is part of it: with temperature > 0 the random draws depend on how rows are batched
        self.measurement = {"checkpoint": checkpoint_sha, "data": data, "seed": cfg.seed, "limit": cfg.limit,
                            "batch_size": cfg.batch_size}
        self.common = {"checkpoint": checkpoint, "checkpoint_sha": checkpoint_sha, "weights": weights,
                       "task": task_name, "test_set": test_set, "seed": cfg.seed, "limit": cfg.limit,
                       "world_size": ranks.world_size}  # how many processes made it; not part of the key
        self.context = {**provenance(), "config": to_container(cfg), "train_config": train_config}

    def key(self, kind: str, sampler: dict[str, Any]) -> str:
        return evaluation_key(kind, sampler, self.measurement)

    def row(self, kind: str, sampler: dict[str, Any], summary: dict[str, Any], preset: str | None = None
            ) -> dict[str, Any]:
        params = {k: v for k, v in sampler.items() if k != "_target_"}
        # `preset`: the conf/sampler option the config came from ("llada"), a name beside the key, not in it
        return {"kind": kind, "key": self.key(kind, sampler), **self.common, "measurement": self.measurement,
                "sampler": sampler, "family": derive_family({"kind": kind, "sampler": sampler}), "preset": preset,
                "params": params, **summary, **self.context}


Measure = Callable[[SweepJob], EvalResult | None]  # None on the ranks other than 0 of a data-parallel run


def _run_job(job: SweepJob, cfg: DictConfig, task_name: str, measure: Measure, rows: _Rows,
             stored: Mapping[str, dict]) -> list[dict]:
    """Measure one job and append its rows, except those already `stored` (the sampler's row, when only the
    oracle floor asked for beside it is new), which it returns as they were stored."""
    recorded = stored.get(rows.key("evaluate", job.sampler))  # only the main rank reads the file
    if job.oracle and recorded is not None:
        print(f"[{task_name}] {row_label(recorded)}: in {cfg.results_file}; sampled again for its oracle floor "
              "(the row is kept, not written twice)")
    result = measure(job)
    if result is None:
        return []
    summary = result.summary()
    made = [rows.row("evaluate", job.sampler, summary, job.preset)]
    print(f"[{task_name}] {row_label(made[0])}: {format_summary(summary)}")
    if result.oracle_nfe is not None:
        # the floor as a sampler of its own, so fronts and tables can draw it beside the real samplers
        floor = {**summary, "nfe_mean": summary["oracle_nfe_mean"], "nfe_median": summary["oracle_nfe"]["p50"],
                 "nfe": summary["oracle_nfe"], "cost_mean": summary["oracle_nfe_mean"], "wall_time_s": None,
                 "tokens_per_s": None}
        made.append(rows.row("oracle", {"name": "oracle", "reference": job.sampler}, floor, job.preset))
        print(f"[{task_name}] {row_label(made[1])}: NFE mean {summary['oracle_nfe_mean']:.2f}")
    return [stored[row["key"]] if row["key"] in stored else append_record(cfg.results_file, row) for row in made]


def _puzzle_setup(cfg: DictConfig, task: PuzzleTask | None, ranks: Ranks,
                  task_fields: Collection[str] | None = None) -> tuple[str, _Rows, Measure]:
    """A trained mdmkit checkpoint on a generated puzzle task (its own, or `task=` with the same vocabulary)."""
    trained = TrainedModel(cfg.ckpt)
    if task is not None:  # `task=maze` on a maze checkpoint: its trained settings, unless overridden by name
        task, kept = trained.task_for(to_container(cfg.task), task_fields)
        if kept and ranks.main and not task.test_file:  # a test_file replaces the data those settings make
            print(f"[{task.name}] kept from the checkpoint: {', '.join(kept)} (task.FIELD=... sets one)")
    task = task if task is not None else trained.task
    network = trained.network(task).to(resolve_device(cfg.device))
    test = task.load_test().head(cfg.limit)  # once: every sampler sees the same examples; no train/val made
    data = {"task": task.fingerprint(),
            "test_file": file_fingerprint(str(Path(task.test_file).expanduser())) if task.test_file else None}
    test_set = test.fingerprint()
    rows = _Rows(cfg, str(trained.path), file_fingerprint(str(trained.path)), task.name, data, test_set, "ema",
                 trained.config, ranks)

    objective = str((trained.config.get("objective") or {}).get("_target_", ""))

    def measure(job: SweepJob) -> EvalResult:
        sampler = build_sampler(job.sampler, network)
        check_trained_for(objective, sampler)
        return sample_split(network, task, test, sampler, cfg.batch_size, cfg.seed, progress=True, oracle=job.oracle,
                            ranks=ranks)

    return task.name, rows, measure


def _text_setup(cfg: DictConfig, task: TextTask, ranks: Ranks, jobs: list[SweepJob]) -> tuple[str, _Rows, Measure]:
    """A Hugging Face model (`ckpt` = directory or hub name, `hf.kind`) on GSM8K / HumanEval / MBPP."""
    hf = build({"_target_": "mdmkit.evaluation.text_eval.HFModelConfig", **to_container(cfg.hf)}, "hf")
    require(task.limit is None, f"task.limit={task.limit}: give limit={task.limit} (the rows record that one)")
    task.limit = cfg.limit
    # a causal kind takes sampler=ntp (or sbd), a masked model a masked sampler: checked before loading
    causal = model_kind(hf.kind).decoding == "causal"
    for job in jobs:
        check_decoder(causal, build_sampler(job.sampler))
    task.check_can_score()  # the code sandbox's opt-in and isolation: refused now, not after hours of generation
    data = {"task": task.fingerprint()}  # loads the documents: a malformed file stops before the model loads
    model = load_text_model(cfg.ckpt, hf, str(resolve_device(cfg.device)))
    require(model.max_length is None or model.max_length > task.max_gen_len,
            f"task.max_gen_len={task.max_gen_len} leaves no room for a prompt in the model's {model.max_length} "
            "positions (hf.max_length)")
    rows = _Rows(cfg, cfg.ckpt, model_fingerprint(cfg.ckpt, hf.adapter), task.name, data, data["task"], hf.kind, None,
                 ranks)
    rows.common["parameters"] = parameter_counts(model.network)  # beside the key, not in it
    generations = Path(cfg.results_file).parent / "generations"

    def measure(job: SweepJob) -> EvalResult:
        require(not job.oracle, "oracle=true is defined for puzzle tasks only")
        sampler = build_sampler(job.sampler, model.network)
        file = generations / f"{task.name}-{rows.key('evaluate', job.sampler)}.jsonl"
        result = evaluate_text_task(model, task, sampler, cfg.batch_size, cfg.seed, file, ranks)
        if ranks.main:
            print(f"[{task.name}] generations: {file}")
        return result

    return task.name, rows, measure


def _sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM (a SLURM time limit, `kill`) end a sweep as Ctrl-C does, saying what is saved and how to go
    on; returns what puts the previous handler back. Signals reach the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _check_checkpoint_kind(ckpt: str, task: Any) -> None:
    """A model of the other kind than the task takes, named with the fix: text tasks load a Hugging Face model
    directory, puzzle tasks an mdmkit checkpoint file."""
    path = Path(ckpt).expanduser()
    if isinstance(task, TextTask):
        require(not path.is_file(), f"ckpt={ckpt} is a file: task={task.name} loads a Hugging Face model directory "
                                    "or hub name (an mdmkit checkpoint evaluates on its own task: leave out task=)")
    else:
        require(not (path / "config.json").is_file(),
                f"ckpt={ckpt} is a Hugging Face model directory: name a text task and the model's kind, e.g. "
                "task=gsm8k hf.kind=llada")


def run_evaluation(cfg: DictConfig, output_dir: Path | None = None,
                   task_fields: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Evaluate every sampler of the run (one, or a sweep's grid); returns the rows, new and resumed.

    `task_fields`: the `task.*` fields set by name on the command line (cli/overrides.py); with `task=` naming the
    checkpoint's own task, the other fields keep their trained values. None: all of `cfg.task` as given."""
    require(cfg.ckpt is not None, "ckpt=... is required: an mdmkit checkpoint, or for text tasks a Hugging Face "
                                  "model directory or hub name")
    require_int("batch_size", cfg.batch_size, 1)
    require_int("limit", cfg.limit, 1, optional=True)
    require_int("seed", cfg.seed, 0)
    require_bool("oracle", cfg.oracle)
    require_bool("resume", cfg.resume)
    check_writable(cfg.results_file)  # rows made by hours of sampling must have somewhere to go
    jobs = expand(cfg.sweep) if cfg.get("sweep") else [SweepJob(to_container(cfg.sampler), bool(cfg.oracle),
                                                                chosen_preset())]
    for job in jobs:
        build_sampler(job.sampler)  # every sampler is valid before the model is even loaded
    resolve_device(cfg.device)  # device=cuda without CUDA: one line now, not a traceback from the first .to()
    task = build(cfg.task, "task") if cfg.get("task") is not None else None
    _check_checkpoint_kind(str(cfg.ckpt), task)
    ranks = init_ranks(cfg.device)  # torchrun / SLURM tasks: this process's share of every split
    if isinstance(task, TextTask):
        task_name, rows, measure = _text_setup(cfg, task, ranks, jobs)
    else:
        task_name, rows, measure = _puzzle_setup(cfg, task, ranks, task_fields)
    finished = {r["key"]: r for r in read_records(cfg.results_file) if "key" in r} if cfg.resume and ranks.main else {}
    resumed = ranks.broadcast(set(finished))  # every rank skips the same samplers

    collected: list[dict[str, Any]] = []
    made = 0  # rows written by this run
    restore_sigterm = _sigterm_as_interrupt()
    try:
        for job in progress_bar(jobs, desc="sweep", unit="sampler", disable=len(jobs) == 1 or not ranks.main):
            keys = [rows.key("evaluate", job.sampler)]
            if job.oracle:
                keys.append(rows.key("oracle", {"name": "oracle", "reference": job.sampler}))
            if all(k in resumed for k in keys):
                if not ranks.main:
                    continue
                done = [finished[k] for k in keys]
                print(f"[{task_name}] {row_label(done[0])}: already in {cfg.results_file} (resume=false re-runs "
                      f"it): accuracy {done[0]['accuracy']:.4f}, NFE mean {done[0]['nfe_mean']:.2f}")
                collected += done
                continue
            new = _run_job(job, cfg, task_name, measure, rows, finished)
            made += sum(row["key"] not in resumed for row in new)
            collected += new
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not land in the exit handlers
        if ranks.main:  # Ctrl-C: what is saved and how to go on, instead of a traceback
            print(f"\ninterrupted: {made} new row(s) saved to {cfg.results_file}; run the same command again to "
                  f"resume (settings already there are skipped)", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        restore_sigterm()
    ranks.leave()
    if not ranks.main:
        return []
    if len(jobs) > 1:
        print(runs_table(collected))
    name = f"{task_name}/{cfg.sweep.name if cfg.get('sweep') else row_label(collected[0])}"
    plot = None
    if len(jobs) > 1 and output_dir is not None:
        sweep_name = f"sweep {cfg.sweep.name}" if cfg.get("sweep") else None
        plot = plot_fronts(collected, output_dir / "pareto.png", title=plot_title(collected, context=sweep_name))
        print(f"accuracy-vs-NFE plot: {plot}")
    log_rows(collected, to_container(cfg.wandb) if cfg.get("wandb") else None, output_dir, name, plot)
    return collected

"""`evaluate.py ckpt=... [task=...] sampler=...|sweep=...`: sample the test split, record accuracy and NFE.

`run_evaluation` takes the run's plan (plan.py's `plan_evaluation`, made once by the CLI from Hydra's config).

One sampler per run (Hydra multirun sweeps over them), or a whole grid (`sweep=...`) on one loaded model.
Rows whose key is already in the results file are skipped, so a killed sweep resumes where it stopped.
Under `torchrun --nproc_per_node=N` (or the N tasks of a SLURM job) every split is sharded across the processes
and rank 0 writes the same rows a single process would (`distributed.py`), with `world_size` beside them.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mdmkit.analysis.pareto_plot import plot_fronts, plot_title
from mdmkit.analysis.pareto_tables import runs_table
from mdmkit.core.config import require
from mdmkit.core.devices import resolve_device
from mdmkit.core.progress import progress_bar
from mdmkit.evaluation.distributed import Ranks, init_ranks
from mdmkit.evaluation.generation import check_trained_for
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.evaluation.plan import EvaluationPlan
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.runner import EvalResult, sample_split
from mdmkit.evaluation.sweep import SweepJob
from mdmkit.evaluation.text_eval import evaluate_text_task, load_text_model, model_fingerprint, parameter_counts
from mdmkit.evaluation.tracking import log_rows
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.naming import derive_family, row_label
from mdmkit.io.results import append_record, evaluation_key, file_fingerprint, provenance, read_records
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

    def __init__(self, plan: EvaluationPlan, checkpoint: str, checkpoint_sha: str, task_name: str, data: dict,
                 test_set: str, weights: str, train_config: dict | None, ranks: Ranks) -> None:
        # batch_size is part of it: with temperature > 0 the random draws depend on how rows are batched
        self.measurement = {"checkpoint": checkpoint_sha, "data": data, "seed": plan.seed, "limit": plan.limit,
                            "batch_size": plan.batch_size}
        self.common = {"checkpoint": checkpoint, "checkpoint_sha": checkpoint_sha, "weights": weights,
                       "task": task_name, "test_set": test_set, "seed": plan.seed, "limit": plan.limit,
                       "world_size": ranks.world_size}  # how many processes made it; not part of the key
        self.context = {**provenance(), "config": plan.config, "train_config": train_config}

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


def _run_job(job: SweepJob, results_file: str, task_name: str, measure: Measure, rows: _Rows,
             stored: Mapping[str, dict]) -> list[dict]:
    """Measure one job and append its rows, except those already `stored` (the sampler's row, when only the
    oracle floor asked for beside it is new), which it returns as they were stored."""
    recorded = stored.get(rows.key("evaluate", job.sampler))  # only the main rank reads the file
    if job.oracle and recorded is not None:
        print(f"[{task_name}] {row_label(recorded)}: in {results_file}; sampled again for its oracle floor "
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
    return [stored[row["key"]] if row["key"] in stored else append_record(results_file, row) for row in made]


def _puzzle_setup(plan: EvaluationPlan, ranks: Ranks) -> tuple[str, _Rows, Measure]:
    """A trained mdmkit checkpoint on a generated puzzle task (its own, or `task=` with the same vocabulary)."""
    trained = TrainedModel(plan.ckpt)
    task = trained.task
    if plan.task_node is not None:  # `task=maze` on a maze checkpoint: its trained settings, unless overridden by name
        task, kept = trained.task_for(plan.task_node, plan.task_fields)
        if kept and ranks.main and not task.test_file:  # a test_file replaces the data those settings make
            print(f"[{task.name}] kept from the checkpoint: {', '.join(kept)} (task.FIELD=... sets one)")
    network = trained.network(task).to(resolve_device(plan.device))
    test = task.load_test().head(plan.limit)  # once: every sampler sees the same examples; no train/val made
    data = {"task": task.fingerprint(),
            "test_file": file_fingerprint(str(Path(task.test_file).expanduser())) if task.test_file else None}
    test_set = test.fingerprint()
    rows = _Rows(plan, str(trained.path), file_fingerprint(str(trained.path)), task.name, data, test_set, "ema",
                 trained.config, ranks)

    objective = str((trained.config.get("objective") or {}).get("_target_", ""))

    def measure(job: SweepJob) -> EvalResult | None:
        sampler = build_sampler(job.sampler, network)
        check_trained_for(objective, sampler)
        return sample_split(network, task, test, sampler, plan.batch_size, plan.seed, progress=True,
                            oracle=job.oracle, ranks=ranks)

    return task.name, rows, measure


def _text_setup(plan: EvaluationPlan, task: TextTask, hf: HFModelConfig, ranks: Ranks) -> tuple[str, _Rows, Measure]:
    """A Hugging Face model (`ckpt` = directory or hub name, `hf.kind`) on GSM8K / HumanEval / MBPP; the plan has
    checked the task, the samplers' kind and the code sandbox."""
    data = {"task": task.fingerprint()}  # loads the documents: a malformed file stops before the model loads
    model = load_text_model(plan.ckpt, hf, str(resolve_device(plan.device)))
    require(model.max_length is None or model.max_length > task.max_gen_len,
            f"task.max_gen_len={task.max_gen_len} leaves no room for a prompt in the model's {model.max_length} "
            "positions (hf.max_length)")
    rows = _Rows(plan, plan.ckpt, model_fingerprint(plan.ckpt, hf.adapter), task.name, data, data["task"], hf.kind,
                 None, ranks)
    rows.common["parameters"] = parameter_counts(model.network)  # beside the key, not in it
    generations = Path(plan.results_file).parent / "generations"

    def measure(job: SweepJob) -> EvalResult | None:
        require(not job.oracle, "oracle=true is defined for puzzle tasks only")
        sampler = build_sampler(job.sampler, model.network)
        file = generations / f"{task.name}-{rows.key('evaluate', job.sampler)}.jsonl"
        result = evaluate_text_task(model, task, sampler, plan.batch_size, plan.seed, file, ranks)
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

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def run_evaluation(plan: EvaluationPlan, output_dir: Path | None = None) -> list[dict[str, Any]]:
    """Evaluate every sampler of the run (one, or a sweep's grid); returns the rows, new and resumed."""
    jobs = plan.jobs
    ranks = init_ranks(plan.device)  # torchrun / SLURM tasks: this process's share of every split
    if isinstance(plan.task, TextTask):
        assert plan.hf is not None, "a text task's plan holds its model settings (plan_evaluation)"
        task_name, rows, measure = _text_setup(plan, plan.task, plan.hf, ranks)
    else:
        task_name, rows, measure = _puzzle_setup(plan, ranks)
    finished: dict[str, dict] = {}  # only the main rank reads the file
    if plan.resume and ranks.main:
        finished = {r["key"]: r for r in read_records(plan.results_file) if "key" in r}
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
                print(f"[{task_name}] {row_label(done[0])}: already in {plan.results_file} (resume=false re-runs "
                      f"it): accuracy {done[0]['accuracy']:.4f}, NFE mean {done[0]['nfe_mean']:.2f}")
                collected += done
                continue
            new = _run_job(job, plan.results_file, task_name, measure, rows, finished)
            made += sum(row["key"] not in resumed for row in new)
            collected += new
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not land in the exit handlers
        if ranks.main:  # Ctrl-C: what is saved and how to go on, instead of a traceback
            print(f"\ninterrupted: {made} new row(s) saved to {plan.results_file}; run the same command again to "
                  f"resume (settings already there are skipped)", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        restore_sigterm()
    ranks.leave()
    if not ranks.main:
        return []
    if len(jobs) > 1:
        print(runs_table(collected))
    name = f"{task_name}/{plan.sweep_name or row_label(collected[0])}"
    plot = None
    if len(jobs) > 1 and output_dir is not None:
        sweep_name = f"sweep {plan.sweep_name}" if plan.sweep_name else None
        plot = plot_fronts(collected, output_dir / "pareto.png", title=plot_title(collected, context=sweep_name))
        print(f"accuracy-vs-NFE plot: {plot}")
    log_rows(collected, plan.wandb, output_dir, name, plot)
    return collected

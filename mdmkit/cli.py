"""Console entry points (`mdmkit-train`, `mdmkit-evaluate`, `mdmkit-lm-eval`; `train.py`/`evaluate.py` at the root)."""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import shutil
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from mdmkit.core.config import to_container
from mdmkit.core.errors import ConfigError, MdmkitError
from mdmkit.training.resume import ResumePlan, is_rank_zero, parse_overrides, plan_resume

_resume: ResumePlan | None = None  # set by `train` when ckpt_path= names a run directory


class _NoAdverts(logging.Filter):
    """Lightning's "💡 Tip: ... try installing litlogger / litmodels" lines, on every job."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith("💡 Tip")


def _options(group: str, indent: int = 0) -> str:
    """`${mdmkit_options:sampler,29}` in the --help templates (conf/hydra/help/): the group's options on the config
    search path (user config groups included), wrapped to the width of the help and indented by `indent`."""
    names = GlobalHydra.instance().hydra.config_loader.get_group_options(group)  # type: ignore[union-attr]
    margin = " " * int(indent)
    return textwrap.fill(", ".join(names), width=110, initial_indent=margin, subsequent_indent=margin).lstrip()


def _set_up_process() -> None:
    """What a command line sets for its whole process, here rather than at import (a library importing mdmkit
    keeps its own warnings, logging and environment): quieter third-party output, the --help resolver."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")  # Lightning-internal noise
    # wandb's banner and run summary (info only: its warnings and errors still show; WANDB_SHOW_INFO=true for all)
    os.environ.setdefault("WANDB_SHOW_INFO", "false")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoAdverts) for f in logger.filters):
            logger.addFilter(_NoAdverts())
    OmegaConf.register_new_resolver("mdmkit_options", _options, replace=True)


def _task_fields(overrides: list[str]) -> set[str]:
    """The task fields a command line sets by name (`task.answer=path`, `~task.test_file`), not through `task=`."""
    return {o.key_or_group.split(".")[1] for o in parse_overrides(overrides) if o.key_or_group.startswith("task.")}


def _check_sweep_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """`sweep=` takes every sampler and its oracle flag from the sweep's grid: refuse `sampler...` and `oracle=`
    given beside it, which would be ignored (every row found done, or made with the grid's settings)."""
    if not cfg.get("sweep"):
        return
    ignored = [o.input_line for o in OverridesParser.create().parse_overrides(overrides)
               if o.key_or_group.split(".")[0] in ("sampler", "oracle")]
    if ignored:
        raise ConfigError(f"sweep={cfg.sweep.get('name', '...')} sets the samplers and oracle of each row; "
                          f"{' '.join(ignored)} would be ignored: drop it, or add it to the sweep's grid")


def _save_rows(rows: list[dict[str, Any]], output_dir: Path) -> None:
    """A copy of the run's rows (new and resumed) in its Hydra directory, so that `scripts/pareto.py multirun/...`
    finds a multirun's rows under it (results_file is where every run appends them, usually outside)."""
    if rows:
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(output_dir / "rows.jsonl", "w") as file:
            file.writelines(json.dumps(row) + "\n" for row in rows)


_HYDRA_RECORD = {".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}
FAILED_JOBS_ENV = "MDMKIT_FAILED_JOBS_DIR"  # where a multirun's jobs note their failures (set by `FailedJobs`)
_failed_jobs: list[str] = []  # the sweep's failed jobs, gathered from their notes when the multirun ends
_jobs_run = 0  # how many jobs the sweep ran (their `.started` notes)


@contextmanager
def _contained() -> Iterator[None]:
    """A run's failure: one line on stderr (with a traceback for a bug) and status 2. In a multirun every job's
    failure is contained, so the sweep goes on: the job notes it where `FailedJobs` (in the launching process,
    whichever launcher, process or node ran the job) finds it and lists them all at the end, status 2."""
    hydra_config = HydraConfig.get()
    multirun, notes = hydra_config.mode == RunMode.MULTIRUN, os.environ.get(FAILED_JOBS_ENV)
    if notes and multirun:
        Path(notes, f"{hydra_config.job.num}.started").touch()  # how many jobs ran, for the summary
    try:
        yield
    except Exception as error:  # noqa: BLE001 -- a multirun contains every job's failure
        if not isinstance(error, MdmkitError):
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        if not multirun:
            if isinstance(error, MdmkitError):  # refused: a crash keeps its record
                _discard_if_untouched(Path(hydra_config.runtime.output_dir))
            sys.exit(2)
        if notes:
            note = {"num": hydra_config.job.num, "overrides": list(hydra_config.overrides.task), "error": str(error)}
            Path(notes, f"{hydra_config.job.num}.json").write_text(json.dumps(note))


def _discard_if_untouched(output_dir: Path) -> None:
    """A run refused before it wrote anything leaves no directory behind: Hydra's record of it goes, and then the
    directory, if that emptied it (never the working directory)."""
    entries = (path.relative_to(output_dir).as_posix() for path in output_dir.rglob("*"))
    if not is_rank_zero() or any(entry not in _HYDRA_RECORD for entry in entries):
        return
    with suppress(OSError):  # another process may be clearing it too: the refusal's one line stays the message
        for name in sorted(_HYDRA_RECORD, reverse=True):  # files, then .hydra
            path = output_dir / name
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        if not any(output_dir.iterdir()) and output_dir.resolve() != Path.cwd().resolve():
            output_dir.rmdir()


class FailedJobs(Callback):
    """`hydra.callbacks` of train.yaml and evaluate.yaml. A multirun's jobs note their failures in
    `<sweep dir>/failed_jobs/` (made afresh for each multirun; jobs find it through $MDMKIT_FAILED_JOBS_DIR,
    whatever directory their own config gives them); at the end this lists them with their swept values."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        notes = Path(str(config.hydra.sweep.dir), "failed_jobs").resolve()
        shutil.rmtree(notes, ignore_errors=True)
        notes.mkdir(parents=True)
        os.environ[FAILED_JOBS_ENV] = str(notes)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _jobs_run
        notes_dir = Path(os.environ.pop(FAILED_JOBS_ENV))
        _jobs_run = len(list(notes_dir.glob("*.started")))
        notes = sorted((json.loads(path.read_text()) for path in notes_dir.glob("*.json")), key=lambda n: n["num"])
        for started in notes_dir.glob("*.started"):
            started.unlink()
        if not notes:
            notes_dir.rmdir()
        parser = OverridesParser.create()
        swept = {o.key_or_group for o in parser.parse_overrides(list(config.hydra.overrides.task))
                 if o.is_sweep_override()}
        for note in notes:
            values = [o for o in parser.parse_overrides(note["overrides"]) if o.key_or_group in swept]
            label = " ".join(f"{o.key_or_group}={o.value()}" for o in values)
            _failed_jobs.append(f"job {note['num']}{f' ({label})' if label else ''}: {note['error']}")


def _one_line_refusal(run: Callable[[list[str]], Any]) -> Any:
    """`run(argv)`, a refusal (`MdmkitError`) ending in one line and status 2 (before Hydra: and no run directory)."""
    try:
        return run(sys.argv[1:])
    except MdmkitError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _unknown_keys(config_name: str) -> Callable[[list[str]], None]:
    """A check for `_one_line_refusal`: an override of a key its node does not have (`sampler.gama=0.1`) is refused
    naming the close key and the valid ones, where Hydra would suggest appending it (`+sampler.gama`)."""

    def check(argv: list[str]) -> None:
        from hydra import compose, initialize_config_module
        from hydra.errors import ConfigCompositionException

        overrides = parse_overrides([a for a in argv if "=" in a and a[0] != "-"])
        plain = [o.input_line for o in overrides
                 if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
        with initialize_config_module("mdmkit.conf", version_base="1.3"):
            try:
                compose(config_name, overrides=plain)
                return
            except ConfigCompositionException as error:
                match = re.match(r"Could not override '([\w.]+)'", str(error))
                if match is None:
                    return  # another problem (a user's config group, ...): Hydra reports it
                key = match.group(1)
                try:
                    composed = compose(config_name, overrides=[o for o in plain if o.split("=")[0] != key])
                except Exception:  # noqa: BLE001 -- best effort: Hydra's own message follows
                    return
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(composed, parent) if parent else composed
        valid = sorted(str(k) for k in node) if isinstance(node, DictConfig) else []
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {parent}.{close[0]}? " if close else ""
        raise ConfigError(f"{key}: {parent or config_name} has no key '{name}' ({hint}valid: {', '.join(valid)})")

    return check


def _exit_if_jobs_failed() -> None:
    if _failed_jobs:
        total = max(_jobs_run, len(_failed_jobs))
        others = " (the rows of the others are saved)" if len(_failed_jobs) < total else ""
        print(f"error: {len(_failed_jobs)} of the sweep's {total} job(s) failed{others}:\n  "
              + "\n  ".join(_failed_jobs), file=sys.stderr)
        sys.exit(2)


def train() -> None:
    """`train.py [key=value ...]`. With `ckpt_path=<run directory or a checkpoint in its checkpoints/>` the run
    goes on in its directory with its saved config, the overrides given now on top (see training/resume.py)."""
    global _resume
    _set_up_process()
    _resume = _one_line_refusal(plan_resume)
    if _resume is not None:
        sys.argv[1:] = _resume.argv
    else:
        _one_line_refusal(_unknown_keys("train"))
    _train()
    _exit_if_jobs_failed()


def _resumed(cfg: DictConfig, plan: ResumePlan) -> tuple[DictConfig, Callable[[], None] | None]:
    """The resumed run's config, and what records it in its directory once training starts (rank 0)."""
    from hydra import compose

    config = plan.config(cfg, lambda overrides: compose(config_name="train", overrides=overrides))
    hydra_node = HydraConfig.get()
    return config, (lambda: plan.record(config, hydra_node)) if is_rank_zero() else None


@hydra.main(version_base="1.3", config_path="pkg://mdmkit.conf", config_name="train")
def _train(cfg: DictConfig) -> None:
    # checks, then heavy imports: a bad value stops before Lightning loads (seconds)
    from mdmkit.training.preflight import check_components, check_run

    with _contained():
        cfg, on_start = _resumed(cfg, _resume) if _resume is not None else (cfg, None)
        check_run(cfg)
        if cfg.get("indicator") is not None or cfg.get("evaluate_after_training", True):
            from mdmkit.core.devices import resolve_device

            resolve_device(cfg.device)  # device=cuda without CUDA: one line now, not after training
        if cfg.get("indicator") is not None:  # experiment=*_indicator: an NI indicator on a frozen base MDM
            from mdmkit.training.indicator.train import run_indicator_training as run
        elif cfg.get("sft") is not None:  # experiment=*_sft: fine-tune a pretrained diffusion LLM
            from mdmkit.training.sft.config import check_sft_components

            check_sft_components(to_container(cfg))
            from mdmkit.training.sft.train import run_sft as run
        else:
            check_components(to_container(cfg))
            from mdmkit.training.train import run_training as run
        run(cfg, Path(HydraConfig.get().runtime.output_dir), on_start=on_start)


def _check_task_named(argv: list[str]) -> None:
    """`task.FIELD=...` needs `task=NAME` beside it: evaluate.py has no task until one is named (the checkpoint's
    own otherwise), and Hydra's own refusal suggests `+task.FIELD`, which builds no task at all."""
    overrides = parse_overrides([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    fields = [o.input_line for o in overrides if o.key_or_group.startswith("task.")]
    if fields and all(o.key_or_group != "task" for o in overrides):
        raise ConfigError(f"{fields[0]} changes a task, but no task=NAME is given: name the checkpoint's task first, "
                          f"e.g. task=sudoku {fields[0].lstrip('+')} (fields not named keep their trained values)")


def evaluate() -> None:
    """`evaluate.py [key=value ...]`; with `-m`, exits with status 2 after the sweep if any of its jobs failed."""
    _set_up_process()
    _one_line_refusal(_check_task_named)
    _one_line_refusal(_unknown_keys("evaluate"))
    _evaluate()
    _exit_if_jobs_failed()


@hydra.main(version_base="1.3", config_path="pkg://mdmkit.conf", config_name="evaluate")
def _evaluate(cfg: DictConfig) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation

    hydra_config = HydraConfig.get()
    output_dir = Path(hydra_config.runtime.output_dir)
    with _contained():
        _check_sweep_overrides(cfg, list(hydra_config.overrides.task))
        rows = run_evaluation(cfg, output_dir, task_fields=_task_fields(list(hydra_config.overrides.task)))
        if hydra_config.mode == RunMode.MULTIRUN:
            _save_rows(rows, output_dir)


def _check_lm_eval_model_args(argv: list[str]) -> None:
    """`--model mdmkit --model_args ...` checked before lm-eval indexes its task library (seconds, not a minute)."""
    from mdmkit.evaluation.lm_eval_model import check_model_args

    values = {}
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in ("--model", "--model_args"):
            values[name] = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
    if values.get("--model") == "mdmkit" and values.get("--model_args"):
        check_model_args(values["--model_args"])


def lm_eval() -> None:
    """lm-eval's own command line with the `mdmkit` model registered (lm-eval has no plugin hook for models)
    and mdmkit's task configs (`mdmkit_gsm8k`, `mdmkit_humaneval`, `mdmkit_mbpp`) on the include path. Logged
    samples carry each generation's NFE; a bad `model_args` value ends with one line and status 2."""
    import lm_eval as harness
    from lm_eval.__main__ import cli_evaluate

    import mdmkit.evaluation.lm_eval_model  # noqa: F401 -- registers --model mdmkit
    from mdmkit.evaluation.distributed import leave_process_group
    from mdmkit.evaluation.lm_eval_nfe import with_nfe

    _set_up_process()
    _one_line_refusal(_check_lm_eval_model_args)
    if "--include_path" not in sys.argv:
        sys.argv += ["--include_path", str(Path(__file__).parent / "lm_eval_tasks")]
    if not hasattr(harness.simple_evaluate, "mdmkit_nfe"):  # the CLI reads `lm_eval.simple_evaluate`
        harness.simple_evaluate = with_nfe(harness.simple_evaluate)
    _one_line_refusal(lambda argv: cli_evaluate())
    leave_process_group()  # a data-parallel run (the mdmkit model joined torchrun's group)

"""A multirun's failed jobs, listed when the sweep ends: the Hydra callback of train.yaml and evaluate.yaml.

A failed job does not stop a sweep (the command line contains it: `process.contained`); the sweep ends with
the list of the jobs that failed, each with its swept values and error, and status 2. Jobs run in the launching
process, in worker processes or on other nodes, and each may have a sweep directory of its own (train.yaml's
holds `run_name`), so they report through files: the launching process makes `<sweep dir>/failed_jobs/` afresh
and hands its path to the jobs in the environment, which every launcher passes on; each job notes there that it
ran and, if it failed, why.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.conf import HydraConf
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

NOTES_ENV = "MDMKIT_FAILED_JOBS_DIR"  # the notes' directory, for the jobs of the multirun under way


def _notes() -> Path | None:
    notes = os.environ.get(NOTES_ENV)
    return Path(notes) if notes else None


def note_failure(hydra_config: HydraConf, error: BaseException) -> None:
    """In a multirun's job (`hydra_config` its Hydra node): why it failed, for `FailedJobs` to list."""
    notes = _notes()
    if notes is not None:
        note = {"num": hydra_config.job.num, "overrides": list(hydra_config.overrides.task), "error": str(error)}
        (notes / f"{hydra_config.job.num}.json").write_text(json.dumps(note))


class FailedJobs(Callback):
    """At the end of a multirun, the jobs that failed on stderr and status 2; nothing when all succeeded."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        notes = Path(str(config.hydra.sweep.dir), "failed_jobs").resolve()
        shutil.rmtree(notes, ignore_errors=True)
        notes.mkdir(parents=True)
        os.environ[NOTES_ENV] = str(notes)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """In the job's process: how many jobs ran, for the summary."""
        notes = _notes()
        if notes is not None and config.hydra.mode == RunMode.MULTIRUN:
            (notes / f"{config.hydra.job.num}.started").touch()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        notes = Path(os.environ.pop(NOTES_ENV))
        started = list(notes.glob("*.started"))
        failed = sorted((json.loads(path.read_text()) for path in notes.glob("*.json")), key=lambda n: n["num"])
        for path in started:
            path.unlink()
        if not failed:
            notes.rmdir()
            return
        parser = OverridesParser.create()
        swept = {o.key_or_group for o in parser.parse_overrides(list(config.hydra.overrides.task))
                 if o.is_sweep_override()}
        lines = []
        for note in failed:
            values = [o for o in parser.parse_overrides(note["overrides"]) if o.key_or_group in swept]
            label = " ".join(f"{o.key_or_group}={o.value()}" for o in values)
            lines.append(f"job {note['num']}{f' ({label})' if label else ''}: {note['error']}")
        total = max(len(started), len(failed))
        others = " (the rows of the others are saved)" if len(failed) < total else ""
        print(f"error: {len(failed)} of the sweep's {total} job(s) failed{others}:\n  " + "\n  ".join(lines),
              file=sys.stderr)
        sys.exit(2)  # the configs list this callback first, and Hydra ends callbacks in reverse: it ends last

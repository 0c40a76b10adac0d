"""What a command line does around a run: the process's set-up, and a failure ended as one line.

A library importing mdmkit keeps its own warnings, logging and environment: nothing here runs at import.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from mdmkit.cli.failed_jobs import note_failure
from mdmkit.core.errors import MdmkitError
from mdmkit.training.resume import is_rank_zero

T = TypeVar("T")
# what Hydra writes into a run directory before the run starts
_HYDRA_RECORD = {".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}


class _NoAdverts(logging.Filter):
    """Lightning's "💡 Tip: ... try installing litlogger / litmodels" lines, on every job."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith("💡 Tip")


def _options(group: str, indent: int = 0) -> str:
    """`${mdmkit_options:sampler,29}` in the --help templates (conf/hydra/help/): the group's options on the config
    search path (user config groups included), wrapped to the width of the help and indented by `indent`."""
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None, "the --help resolver runs inside Hydra"
    names = hydra.config_loader.get_group_options(group)
    margin = " " * int(indent)
    return textwrap.fill(", ".join(names), width=110, initial_indent=margin, subsequent_indent=margin).lstrip()


def set_up_process() -> None:
    """What a command line sets for its whole process: quieter third-party output, the --help resolver."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")  # Lightning-internal noise
    # wandb's banner and run summary (info only: its warnings and errors still show; WANDB_SHOW_INFO=true for all)
    os.environ.setdefault("WANDB_SHOW_INFO", "false")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoAdverts) for f in logger.filters):
            logger.addFilter(_NoAdverts())
    OmegaConf.register_new_resolver("mdmkit_options", _options, replace=True)


def refused_in_one_line(check: Callable[[list[str]], T]) -> T:
    """`check(argv)` on the command line's arguments; a refusal (`MdmkitError`) ends the process with one line
    and status 2 (before Hydra starts: so no run directory either)."""
    try:
        return check(sys.argv[1:])
    except MdmkitError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


@contextmanager
def command_line(argv: list[str]) -> Iterator[None]:
    """`argv` as the process's arguments while the block runs, then the real ones again: Hydra's `main` and
    lm-eval's command line take theirs from `sys.argv` only, and have no other way in."""
    given = sys.argv[1:]
    sys.argv[1:] = argv
    try:
        yield
    finally:
        sys.argv[1:] = given


@contextmanager
def contained() -> Iterator[None]:
    """A Hydra job's failure as one line on stderr (with a traceback for a bug). A single run ends with status 2,
    leaving no directory if it was refused before writing anything; in a multirun the job's failure is noted for
    `FailedJobs` and the sweep goes on."""
    hydra_config = HydraConfig.get()
    try:
        yield
    except Exception as error:  # noqa: BLE001 -- a multirun contains every job's failure
        if not isinstance(error, MdmkitError):
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        if hydra_config.mode == RunMode.MULTIRUN:
            note_failure(hydra_config, error)
            return
        if isinstance(error, MdmkitError):  # refused: a crash keeps its record
            _discard_if_untouched(Path(hydra_config.runtime.output_dir))
        sys.exit(2)


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

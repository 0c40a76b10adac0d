"""Results pages: the files behind one page under docs/results/ and the lines every page carries.

A page is an output prefix `<out>`: `<out>.md` for the reader, `<out>.png` for its figure, and its data as
`<out>.json` (one record) or `<out>.jsonl` (one row per line). A page is only worth keeping if it names the
command that re-makes it and where and from which commit it was made; written once here, every benchmark
script states those the same way and cannot drift into its own version of them.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdmkit.core.errors import MdmkitError
from mdmkit.io.results import machine, provenance

ROOT = Path(__file__).resolve().parents[2]
_SEPARATORS = {"l": "---", "r": "---:", "c": ":---:"}


def command_line(script: str | Path, args: Sequence[str]) -> str:
    """The command that re-makes a run, as typed in the repository root: `python scripts/<name>.py ARG...`, or
    `python -m benchmarks.<name> ARG...` for a module of a package there (benchmarks/, experiments/<name>/).

    `script` is the script's file (its `__file__`); `args` are its arguments, quoted where the shell needs it.
    """
    path = Path(script).resolve()
    if path.is_relative_to(ROOT) and (path.parent / "__init__.py").exists():
        return shlex.join(["python", "-m", ".".join(path.relative_to(ROOT).with_suffix("").parts), *args])
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return shlex.join(["python", str(shown), *args])


def run_script(main: Callable[[], Any], name: str) -> None:
    """A script's entry point: mdmkit's errors (a missing checkpoint, a bad value) and unreadable files end in one
    line and status 2, not a traceback."""
    try:
        main()
    except (MdmkitError, OSError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        sys.exit(2)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a `--limit 0` would leave nothing to measure)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def stamp() -> dict[str, Any]:
    """Where, when and from which code a page was made: date, machine, git commit and package versions."""
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **provenance()}


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table; `align` holds one letter per column, l(eft), r(ight) or c(entre); missing ones: l."""
    separator = "|" + "|".join(_SEPARATORS[letter] for letter in align.ljust(len(header), "l")) + "|"
    lines = [_markdown_row(header), separator, *(_markdown_row(row) for row in rows)]
    return "\n".join(lines)


def _markdown_row(cells: Sequence[Any]) -> str:
    return "|" + "|".join(f" {cell} " if cell != "" else " " for cell in map(str, cells)) + "|"


@dataclass(frozen=True)
class Page:
    """The files of the page with output prefix `out` (`docs/results/sbd_roofline` -> `sbd_roofline.md`)."""

    out: Path

    def file(self, suffix: str) -> Path:
        """`<out><suffix>`, e.g. `file(".png")`; its folder is created."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        return self.out.with_name(self.out.name + suffix)

    def name(self, suffix: str) -> str:
        """The file name of `<out><suffix>`, as the page links to it (the files sit side by side)."""
        return self.out.name + suffix

    def write(self, *, markdown: str | Iterable[str] | None = None, data: Mapping[str, Any] | None = None,
              rows: Iterable[Mapping[str, Any]] | None = None, figure: Any = None,
              indent: int = 2) -> list[Path]:
        """Write the parts given: markdown (text or lines) -> .md, data -> .json (`indent`), rows -> .jsonl
        (keys sorted), a matplotlib figure -> .png at its dpi (then closed). Returns the paths written."""
        written = []
        if figure is not None:
            import matplotlib.pyplot as plt

            written.append(self.file(".png"))
            figure.savefig(written[-1])  # at the figure's own dpi
            plt.close(figure)
        if data is not None:
            written.append(self.file(".json"))
            written[-1].write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
        if rows is not None:
            written.append(self.file(".jsonl"))
            with written[-1].open("w") as handle:
                handle.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        if markdown is not None:
            text = markdown if isinstance(markdown, str) else "\n".join(markdown)
            written.append(self.file(".md"))
            written[-1].write_text(text.rstrip("\n") + "\n")
        return written

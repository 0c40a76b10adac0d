"""Progress that reads well in a terminal and in a log file.

On a terminal, tqdm's bar. Elsewhere (nohup, SLURM, a pipe) a bar redraws with carriage returns, so a log shows
only its last frame: there each update is a line of its own, at most every `LOG_EVERY_S` seconds and at the end.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

LOG_EVERY_S = 30.0  # seconds between progress lines in a log file


def on_terminal(stream: Any = None) -> bool:
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class _LogLines(tqdm):
    """tqdm writing whole lines, at most every `mininterval` seconds (and once more when closed)."""

    # tqdm's own display returns a bool too, which its close reads; the stub (types-tqdm) says None
    def display(self, msg: str | None = None, pos: int | None = None) -> bool:  # type: ignore[override]  # stub
        line = (self.__str__() if msg is None else msg).strip()
        if line and not self.disable:
            self.fp.write(line + "\n")
            self.fp.flush()
        return bool(line)

    def close(self) -> None:
        if not getattr(self, "disable", True):
            self._ema_dt = lambda: None  # the final line gives the overall rate
            self.display()
            self.leave = False  # written: tqdm's own closing frame would repeat it
        super().close()


def progress_bar(iterable: Any = None, **kwargs: Any) -> tqdm:
    """`tqdm(iterable, **kwargs)` on a terminal; plain lines every `LOG_EVERY_S` seconds in a log file."""
    if on_terminal(kwargs.get("file")):
        return tqdm(iterable, **kwargs)
    kwargs.update(mininterval=LOG_EVERY_S, leave=True, ascii=True)
    return _LogLines(iterable, **kwargs)


class ForwardTicks:
    """Counts a batch loop's forward passes on its bar, so a long batch shows it is moving (`ForwardCounter`'s
    `on_forward`); the bar itself counts batches."""

    def __init__(self, bar: tqdm) -> None:
        self.bar, self.forwards = bar, 0

    def __call__(self) -> None:
        self.forwards += 1
        self.bar.set_postfix_str(f"{self.forwards} forwards", refresh=False)
        self.bar.update(0)  # redraws when the bar's interval has passed

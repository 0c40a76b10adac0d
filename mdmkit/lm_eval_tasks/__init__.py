"""lm-eval task configs for mdmkit's GSM8K / HumanEval / MBPP (prompts, stops and scoring as `evaluate.py`).

lm-eval imports `utils.py` from its file under a name of its own, so state shared with the rest of mdmkit lives
here, where both import it by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_PREDICTIONS_ONLY = ContextVar("mdmkit_predictions_only", default=False)


@contextmanager
def predictions_only() -> Iterator[None]:
    """While lm-eval runs with `--predict_only` it scores nothing: code tasks then load without the sandbox."""
    token = _PREDICTIONS_ONLY.set(True)
    try:
        yield
    finally:
        _PREDICTIONS_ONLY.reset(token)


def scoring_skipped() -> bool:
    return _PREDICTIONS_ONLY.get()

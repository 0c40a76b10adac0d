"""`mdmkit-lm-eval`: lm-eval's own command line, with mdmkit's model, its task configs and each answer's NFE.

The model goes through lm-eval's public registry, by module path (imported only when `--model mdmkit` is asked
for). lm-eval's command line has no other way to add task configs than `--include_path`, and no hook on what an
evaluation returns: so mdmkit's task directory is added to the arguments when none is given, and while the
command runs the `lm_eval.simple_evaluate` it calls is `with_nfe`'s, which puts the NFE into the logged samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL = "mdmkit"
TASKS = Path(__file__).resolve().parents[1] / "lm_eval_tasks"


def register_model() -> None:
    """`--model mdmkit` in lm-eval's registry. lm-eval's own models first: its registry loads them only while
    it is empty, so a registry holding mdmkit alone would not know `--model hf`."""
    import lm_eval.models  # noqa: F401 -- registers lm-eval's own models, by module path
    from lm_eval.api.registry import model_registry

    if MODEL not in model_registry:
        model_registry.register(MODEL, target="mdmkit.evaluation.lm_eval_model:MdmkitLM")


def checked_arguments(argv: list[str]) -> list[str]:
    """The command line lm-eval is given: `--model mdmkit --model_args ...` checked before lm-eval indexes its task
    library (seconds, not a minute), and mdmkit's task configs on the include path unless one is given."""
    values = {}
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in ("--model", "--model_args"):
            values[name] = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
    if values.get("--model") == MODEL and values.get("--model_args"):
        from mdmkit.evaluation.lm_eval_model import check_model_args as check

        check(values["--model_args"])
    return argv if "--include_path" in argv else [*argv, "--include_path", str(TASKS)]


@contextmanager
def nfe_in_samples() -> Iterator[None]:
    """While the block runs, `lm_eval.simple_evaluate` (which lm-eval's command line calls) returns samples with
    their NFE; after it, lm-eval's own again."""
    import lm_eval

    from mdmkit.evaluation.lm_eval_nfe import with_nfe

    own = vars(lm_eval).get("simple_evaluate")  # lm-eval loads it lazily, on first use
    lm_eval.simple_evaluate = with_nfe(lm_eval.simple_evaluate)
    try:
        yield
    finally:
        if own is None:
            del lm_eval.simple_evaluate
        else:
            lm_eval.simple_evaluate = own

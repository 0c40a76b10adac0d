"""Console entry points (`mdmkit-train`, `mdmkit-evaluate`, `mdmkit-lm-eval`; `train.py`/`evaluate.py` at the root)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mdmkit.core.errors import MdmkitError

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")  # Lightning-internal noise


def _fail(error: MdmkitError) -> None:
    """One line on stderr; a single run exits with status 2, a multirun job lets the sweep go on."""
    print(f"error: {error}", file=sys.stderr)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(2)


@hydra.main(version_base="1.3", config_path="pkg://mdmkit.conf", config_name="train")
def train(cfg: DictConfig) -> None:
    # heavy imports after Hydra has parsed the command line
    if cfg.get("indicator") is not None:  # experiment=*_indicator: an NI indicator on a frozen base MDM
        from mdmkit.training.indicator.train import run_indicator_training as run
    else:
        from mdmkit.training.train import run_training as run

    try:
        run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except MdmkitError as error:
        _fail(error)


@hydra.main(version_base="1.3", config_path="pkg://mdmkit.conf", config_name="evaluate")
def evaluate(cfg: DictConfig) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation

    try:
        run_evaluation(cfg, Path(HydraConfig.get().runtime.output_dir))
    except MdmkitError as error:
        _fail(error)


def lm_eval() -> None:
    """lm-eval's own command line with the `mdmkit` model registered (lm-eval has no plugin hook for models)
    and mdmkit's task configs (`mdmkit_gsm8k`, `mdmkit_humaneval`, `mdmkit_mbpp`) on the include path."""
    from lm_eval.__main__ import cli_evaluate

    import mdmkit.evaluation.lm_eval_model  # noqa: F401 -- registers --model mdmkit

    if "--include_path" not in sys.argv:
        sys.argv += ["--include_path", str(Path(__file__).parent / "lm_eval_tasks")]
    cli_evaluate()

"""mdmkit's Hydra configs, shipped as the package `mdmkit.conf`.

Hydra imports this package when it first reads a config from it, so the schemas registered here (mdmkit/core/
schema.py) are there for every composition: the command lines, `mdmkit.core.config.option`, tests and scripts.
Each is a settings dataclass whose defaults the YAML extends instead of restating them:
`schema/run` (train.yaml's top-level run settings), `schema/data` (train.yaml's `data`), `schema/hf`
(evaluate.yaml's `hf`). Only light modules are imported here: composing a config loads no torch.
"""

from mdmkit.core.schema import register
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.training.run_config import DataConfig, RunConfig

register("run", RunConfig)
register("data", DataConfig)
register("hf", HFModelConfig)

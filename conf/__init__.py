"""mdmkit's Hydra configs, shipped as the package `mdmkit.conf`.

Hydra imports this package when it first reads a config from it, so the schemas registered here (mdmkit/core/
schema.py) are there for every composition: the command lines, `mdmkit.core.config.option`, tests and scripts.
Each is a settings dataclass whose defaults the YAML extends instead of restating them: `schema/run` (train.yaml's
top-level run settings), `schema/data` (train.yaml's `data`), `schema/hf` (evaluate.yaml's `hf`), and
`schema/<module>.<Class>` for every settings dataclass the modules below export (samplers, networks, tasks,
objectives, the optimizer, fine-tuning). Reading the samplers' and networks' modules imports torch, which every
command that composes a config goes on to use.
"""

from importlib import import_module

from mdmkit.core.schema import register, register_settings
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.training.run_config import DataConfig, RunConfig

# Where the settings dataclasses that options instantiate are exported: a class added to one of these needs no
# registration of its own.
SETTINGS_MODULES = (
    "mdmkit.samplers", "mdmkit.models", "mdmkit.models.indicator", "mdmkit.models.speculative",
    "mdmkit.models.llm.hf", "mdmkit.objectives", "mdmkit.objectives.speculative", "mdmkit.tasks.arithmetic",
    "mdmkit.tasks.chars", "mdmkit.tasks.code", "mdmkit.tasks.gsm8k", "mdmkit.tasks.maze", "mdmkit.tasks.sudoku",
    "mdmkit.training.indicator.trajectories", "mdmkit.training.optim", "mdmkit.training.sft.config",
    "mdmkit.objectives.rl", "mdmkit.training.rl.config", "mdmkit.training.rl.rewards",
)

register("run", RunConfig)
register("data", DataConfig)
register("hf", HFModelConfig)
for module in SETTINGS_MODULES:
    register_settings(import_module(module))

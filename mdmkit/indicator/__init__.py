"""NI sampling's offline side: base-sampler trajectories, merge labels, the indicator MLP and its training.

The online sampler is `mdmkit.samplers.ni.NISampler`. Only the light modules are imported here; trajectories,
the Lightning module and the training run load the base network and Lightning when imported.
"""

from mdmkit.indicator.labels import draw_rollback, merge_labels, rollback_state
from mdmkit.indicator.model import Features, Indicator, IndicatorConfig, IndicatorScorer, features

__all__ = [
    "Features",
    "Indicator",
    "IndicatorConfig",
    "IndicatorScorer",
    "draw_rollback",
    "features",
    "merge_labels",
    "rollback_state",
]

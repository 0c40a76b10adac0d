"""What RL for a masked diffusion model optimises: likelihood estimates of a rollout and the policy losses on them.

A masked diffusion network has no exact sequence likelihood, so every policy-gradient method for it scores a
rollout through an estimate (`likelihood.py`); the losses (`policy_loss.py`) take those per-token estimates and
the group-normalised advantages (`advantages.py`); SPG's bounds and loss go together (`sandwich.py`).
"""

from mdmkit.objectives.rl.advantages import group_advantages
from mdmkit.objectives.rl.likelihood import (
    CoupledEstimator,
    LikelihoodEstimator,
    MonteCarloELBO,
    OneStepEstimator,
)
from mdmkit.objectives.rl.policy_loss import GRPOLoss, PolicyLoss, WD1Loss
from mdmkit.objectives.rl.sandwich import SandwichEstimator, SPGLoss

__all__ = [
    "CoupledEstimator", "GRPOLoss", "LikelihoodEstimator", "MonteCarloELBO", "OneStepEstimator", "PolicyLoss",
    "SPGLoss", "SandwichEstimator", "WD1Loss", "group_advantages",
]

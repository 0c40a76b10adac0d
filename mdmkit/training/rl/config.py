"""The `rl` node of an RL run (conf/rl/): how many rollouts, by which sampler, scored how, updated how.

Light (no Lightning): the CLI builds and checks it before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mdmkit.core.config import Validated, require
from mdmkit.objectives.rl import GRPOLoss, LikelihoodEstimator, OneStepEstimator, PolicyLoss
from mdmkit.samplers import Sampler, TopKSampler
from mdmkit.training.rl.rewards import Reward


def _rollout_sampler() -> Sampler:
    return TopKSampler(temperature=1.0)  # GRPO compares rollouts of one prompt: they must differ


@dataclass
class RLConfig(Validated):
    """Each step takes `data.batch_size` prompts and `group_size` rollouts of each by `sampler` (any mdmkit
    sampler; it needs a temperature > 0 for the rollouts of a prompt to differ), scores them with `rewards` (name
    -> reward, weighted; conf/reward/), and makes `inner_updates` optimizer steps on them (mu: each with a fresh
    mask of `estimator`, the ratio taken against the policy that rolled them out). `loss.beta` > 0 keeps a frozen
    copy of the starting network as the reference of the KL term. `scale_advantages`: divide by the group's
    standard deviation (GRPO) or not (Dr. GRPO)."""

    group_size: int = 8
    inner_updates: int = 1
    scale_advantages: bool = True
    sampler: Sampler = field(default_factory=_rollout_sampler)
    estimator: LikelihoodEstimator = field(default_factory=OneStepEstimator)
    loss: PolicyLoss = field(default_factory=GRPOLoss)
    rewards: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        require(self.group_size >= 2, f"group_size={self.group_size}: a group of one has no baseline (its advantage "
                "is always 0, so nothing would train); use 2 or more rollouts per prompt")
        require(self.inner_updates >= 1, f"inner_updates={self.inner_updates} must be >= 1")
        deterministic = getattr(self.sampler, "temperature", None) == 0.0 and \
            getattr(self.sampler, "ordering", None) != "random"
        require(not deterministic, f"sampler.temperature=0: the {self.group_size} rollouts of a prompt would all be "
                "the same (every advantage 0, nothing trains); sample them, e.g. rl.sampler.temperature=1.0")
        for name, reward in self.rewards.items():
            require(isinstance(reward, Reward), f"rewards.{name} is not a reward (a node with the _target_ of one: "
                    "conf/reward/)")

    @property
    def keeps_reference(self) -> bool:
        """Whether the KL term needs a frozen reference network."""
        return self.loss.beta > 0

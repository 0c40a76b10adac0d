from mdmkit.samplers.counting import ForwardCounter
from mdmkit.samplers.masked import (
    DreamStepsSampler,
    EBSampler,
    FactorSampler,
    MaskedSampler,
    RevealAllSampler,
    Sampled,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.stopping import StopCondition

__all__ = [
    "DreamStepsSampler",
    "EBSampler",
    "FactorSampler",
    "ForwardCounter",
    "MaskedSampler",
    "RevealAllSampler",
    "Sampled",
    "StepsSampler",
    "StopCondition",
    "ThresholdSampler",
    "TopKSampler",
]

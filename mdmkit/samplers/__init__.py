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
from mdmkit.samplers.oracle import oracle_floor
from mdmkit.samplers.p2 import P2Sampler
from mdmkit.samplers.stopping import StopCondition

__all__ = [
    "DreamStepsSampler",
    "EBSampler",
    "FactorSampler",
    "ForwardCounter",
    "MaskedSampler",
    "P2Sampler",
    "RevealAllSampler",
    "Sampled",
    "StepsSampler",
    "StopCondition",
    "ThresholdSampler",
    "TopKSampler",
    "oracle_floor",
]

from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss
from mdmkit.objectives.sbd import NextTokenLoss, SBDLoss
from mdmkit.objectives.uniform_diffusion import UniformDiffusionLoss

__all__ = ["MaskedDiffusionLoss", "NextTokenLoss", "SBDLoss", "UniformDiffusionLoss"]

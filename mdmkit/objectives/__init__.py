from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss
from mdmkit.objectives.sbd import NextTokenLoss, SBDLoss

__all__ = ["MaskedDiffusionLoss", "NextTokenLoss", "SBDLoss"]

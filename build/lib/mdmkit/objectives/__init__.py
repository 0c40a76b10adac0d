from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss

__all__ = ["MaskedDiffusionLoss"]

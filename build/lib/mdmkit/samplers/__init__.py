from mdmkit.samplers.counting import ForwardCounter
from mdmkit.samplers.masked import MaskedSampler, TopKSampler

__all__ = ["ForwardCounter", "MaskedSampler", "TopKSampler"]

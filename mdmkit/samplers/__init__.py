from mdmkit.samplers.block_diffusion import BlockDiffusionSampler
from mdmkit.samplers.counting import ForwardCounter
from mdmkit.samplers.credit import CreditSampler
from mdmkit.samplers.dus import DUSSampler
from mdmkit.samplers.eb import EBSampler
from mdmkit.samplers.factor import FactorSampler, FastDllmFactorSampler
from mdmkit.samplers.klass import KlassSampler
from mdmkit.samplers.masked import MaskedSampler
from mdmkit.samplers.ni import NISampler
from mdmkit.samplers.oracle import oracle_floor
from mdmkit.samplers.p2 import P2Sampler
from mdmkit.samplers.p2_listing import P2ListingSampler
from mdmkit.samplers.prophet import ProphetSampler
from mdmkit.samplers.protocol import Sampled, Sampler
from mdmkit.samplers.reveal_all import RevealAllSampler
from mdmkit.samplers.sbd import NTPDecoder, SBDSampler
from mdmkit.samplers.steps import DreamStepsSampler, StepsSampler
from mdmkit.samplers.threshold import ThresholdSampler
from mdmkit.samplers.topk import TopKSampler
from mdmkit.samplers.wino import WinoSampler

__all__ = [
    "BlockDiffusionSampler",
    "CreditSampler",
    "DUSSampler",
    "DreamStepsSampler",
    "EBSampler",
    "FactorSampler",
    "FastDllmFactorSampler",
    "ForwardCounter",
    "KlassSampler",
    "MaskedSampler",
    "NISampler",
    "NTPDecoder",
    "P2ListingSampler",
    "P2Sampler",
    "ProphetSampler",
    "RevealAllSampler",
    "SBDSampler",
    "Sampled",
    "Sampler",
    "StepsSampler",
    "ThresholdSampler",
    "TopKSampler",
    "WinoSampler",
    "oracle_floor",
]

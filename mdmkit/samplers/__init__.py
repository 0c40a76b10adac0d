"""Samplers: `core/` is the machinery every sampler shares (the contract, the forward counter, the batch driver,
blocks, caches, the masked loop), `rules/` the sampling rules built on it. Configs name the classes exported here
(`_target_: mdmkit.samplers.EBSampler`), so moving a module never changes a config or a results key."""

from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Sampled, Sampler
from mdmkit.samplers.rules.block_diffusion import BlockDiffusionSampler
from mdmkit.samplers.rules.credit import CreditSampler
from mdmkit.samplers.rules.dus import DUSSampler
from mdmkit.samplers.rules.eb import EBSampler
from mdmkit.samplers.rules.editing import EditingSampler
from mdmkit.samplers.rules.factor import FactorSampler, FastDllmFactorSampler
from mdmkit.samplers.rules.klass import KlassSampler
from mdmkit.samplers.rules.llada2 import Llada2Sampler
from mdmkit.samplers.rules.llada2_1 import Llada21Sampler, M2TSampler
from mdmkit.samplers.rules.ni import NISampler
from mdmkit.samplers.rules.oracle import oracle_floor
from mdmkit.samplers.rules.p2 import P2Sampler
from mdmkit.samplers.rules.p2_listing import P2ListingSampler
from mdmkit.samplers.rules.prophet import ProphetSampler
from mdmkit.samplers.rules.reveal_all import RevealAllSampler
from mdmkit.samplers.rules.revisable import RevisableSampler
from mdmkit.samplers.rules.sbd import NTPDecoder, SBDSampler
from mdmkit.samplers.rules.sdar import SdarSampler
from mdmkit.samplers.rules.slowfast import SlowFastSampler
from mdmkit.samplers.rules.speculative import SpeculativeSampler, WindowSampler
from mdmkit.samplers.rules.steps import DreamStepsSampler, StepsSampler
from mdmkit.samplers.rules.threshold import ThresholdSampler
from mdmkit.samplers.rules.topk import TopKSampler
from mdmkit.samplers.rules.wino import WinoSampler

__all__ = [
    "BlockDiffusionSampler",
    "CreditSampler",
    "DUSSampler",
    "DreamStepsSampler",
    "EBSampler",
    "EditingSampler",
    "FactorSampler",
    "FastDllmFactorSampler",
    "ForwardCounter",
    "KlassSampler",
    "Llada2Sampler",
    "Llada21Sampler",
    "M2TSampler",
    "MaskedSampler",
    "NISampler",
    "NTPDecoder",
    "P2ListingSampler",
    "P2Sampler",
    "ProphetSampler",
    "RevealAllSampler",
    "RevisableSampler",
    "SBDSampler",
    "Sampled",
    "Sampler",
    "SdarSampler",
    "SlowFastSampler",
    "SpeculativeSampler",
    "StepsSampler",
    "ThresholdSampler",
    "TopKSampler",
    "WindowSampler",
    "WinoSampler",
    "oracle_floor",
]

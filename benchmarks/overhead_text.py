"""Sampler overhead on text models, measured inside real runs: the gap between one forward's end and the next's start.

The Sudoku page (`overhead.py`) replays recorded logits; a text canvas makes that impossible (one step's logits at
batch 8, 768 positions and LLaDA's 126,464-token vocabulary are 3 GB). Here the network runs for real behind a
clock that notes when each forward starts and ends: everything between the end of forward i and the start of
forward i + 1 is the loop's work for step i (sampling math, reveal, bookkeeping, the forward counter), on the same
machine in the same seconds as the forwards it is divided by. A run is stopped after `steps` steps: the first
steps of a text canvas are its most expensive (every row active, every answer position still masked), so the
number is an upper bound of a whole run's mean. The weights are random: a forward's time and the loop's work per
step do not depend on them (rules whose counts do are run with fixed shapes; the page names the steps).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.kv_cache_speed import llada_like, random_network
from mdmkit.models.denoiser import capabilities_of
from mdmkit.samplers import (
    CreditSampler,
    DreamStepsSampler,
    DUSSampler,
    EBSampler,
    FactorSampler,
    ForwardCounter,
    KlassSampler,
    ProphetSampler,
    Sampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
    WinoSampler,
)
from mdmkit.samplers.rules.slowfast import SlowFastSampler

BLOCK = 32  # LLaDA's semi-autoregressive block, as text evaluations decode
TEXT_RULES: dict[str, Callable[[], Sampler]] = {
    "top-k k=1": lambda: TopKSampler(k=1, block_length=BLOCK),
    "steps s=8 per block": lambda: StepsSampler(steps=8, block_length=BLOCK),
    "dream s=64": lambda: DreamStepsSampler(steps=64),
    "EB γ=0.1": lambda: EBSampler(gamma=0.1, block_length=BLOCK),
    "EB γ=0.1 / entropy": lambda: EBSampler(gamma=0.1, ordering="entropy", block_length=BLOCK),
    "threshold τ=0.9": lambda: ThresholdSampler(tau=0.9, block_length=BLOCK),
    "factor f=1.0": lambda: FactorSampler(factor=1.0, block_length=BLOCK),
    "top-k k=1 / margin": lambda: TopKSampler(k=1, ordering="margin", block_length=BLOCK),
    "WINO": lambda: WinoSampler(block_length=BLOCK),
    "DUS base=2": lambda: DUSSampler(block_length=BLOCK),
    "SlowFast": lambda: SlowFastSampler(),
    "KLASS": lambda: KlassSampler(block_length=BLOCK),
    "Credit": lambda: CreditSampler(block_length=BLOCK),
    "Prophet (llada base)": lambda: ProphetSampler(),
}


@dataclass(frozen=True)
class TextNetwork:
    """A text network to time the loop against: how to build it and the canvas it fills."""

    name: str
    description: str
    build: Callable[[], tuple[torch.nn.Module, int, int]]  # -> (network, mask id, vocabulary size)
    prompt: int
    answer: int = 256


def _llada_like(vocab_size: int) -> tuple[torch.nn.Module, int, int]:
    network = random_network(llada_like(vocab_size=vocab_size))
    return network, network.mask_id, vocab_size


def _tiny_bert(vocab_size: int = 400, max_positions: int = 4608) -> tuple[torch.nn.Module, int, int]:
    """lm-eval's test model: a random 2-layer, 32-wide BERT through mdmkit's Hugging Face adapter."""
    import transformers

    from mdmkit.models.llm.hf import HFMaskedDiffusion

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=max_positions)
    return HFMaskedDiffusion(transformers.BertForMaskedLM(config).eval(), mask_id=1), 1, vocab_size


TEXT_NETWORKS: dict[str, TextNetwork] = {
    "llada-25m": TextNetwork("llada-25m", "LLaDA-architecture DiffusionLM, 25M parameters, vocabulary 4,096 "
                             "(the KV-cache page's network)", lambda: _llada_like(4096), prompt=512),
    "llada-vocab": TextNetwork("llada-vocab", "the same network with LLaDA's vocabulary of 126,464 tokens",
                               lambda: _llada_like(126_464), prompt=256),
    "bert-gsm8k": TextNetwork("bert-gsm8k", "2-layer, 32-wide random BERT, vocabulary 400, at the length of "
                              "mdmkit_gsm8k's 8-shot prompts under the test tokenizer (lm-eval's slow case)",
                              _tiny_bert, prompt=3840),
}


class EnoughSteps(Exception):
    """Raised by the clock once it has seen the forwards it was asked for."""


class StepClock:
    """Stands between the forward counter and the network and notes each forward's start and end."""

    def __init__(self, network: torch.nn.Module, forwards: int) -> None:
        self.network, self.forwards = network, forwards
        self.capabilities = capabilities_of(network)
        self.starts: list[float] = []
        self.ends: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if len(self.starts) == self.forwards:
            self.starts.append(time.perf_counter())
            raise EnoughSteps
        self.starts.append(time.perf_counter())
        out = self.network(*args, **kwargs)
        self.ends.append(time.perf_counter())
        return out

    @property
    def step_seconds(self) -> list[float]:
        """The loop's time of each step: from a forward's end to the next one's start."""
        return [start - end for end, start in zip(self.ends, self.starts[1:])]

    @property
    def forward_seconds(self) -> list[float]:
        return [end - start for start, end in zip(self.starts, self.ends)]


def canvas(batch: int, prompt: int, answer: int, vocab_size: int, mask_id: int, seed: int = 0) -> torch.Tensor:
    """`batch` rows of `prompt` random tokens (never the mask) followed by `answer` masks."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, prompt), generator=generator)
    tokens = torch.where(tokens == mask_id, (mask_id + 1) % vocab_size, tokens)
    return torch.cat([tokens, torch.full((batch, answer), mask_id)], dim=1)


def time_steps(sampler: Sampler, network: torch.nn.Module, tokens: torch.Tensor, mask_id: int,
               steps: int) -> StepClock:
    """Run `sampler` on `tokens` until `steps` steps are done; the clock holds their times."""
    clock = StepClock(network, steps)
    counter = ForwardCounter(clock, tokens.shape[0])  # type: ignore[arg-type]
    try:
        sampler.sample(counter, tokens, mask_id, torch.Generator().manual_seed(0))
    except EnoughSteps:
        pass
    if len(clock.ends) < steps:
        raise RuntimeError(f"{sampler!r} finished in {len(clock.ends)} forwards, fewer than the {steps} timed")
    return clock


@dataclass
class TextCase:
    """One (network, rule): per trial, the median step overhead and forward time of one timed run."""

    network: str
    rule: str
    overhead: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> list[float]:
        return [o / f for o, f in zip(self.overhead, self.forward)]


def run_text_overhead(network: TextNetwork, rules: dict[str, Callable[[], Sampler]], batch: int, steps: int,
                      trials: int, seed: int = 0, log: Callable[[str], None] = print) -> list[TextCase]:
    """`trials` rounds over every rule (in a fresh random order each round) on one network."""
    model, mask_id, vocab = network.build()
    tokens = canvas(batch, network.prompt, network.answer, vocab, mask_id, seed)
    with torch.no_grad():
        model(tokens[:1])  # warm-up
    runnable = {}
    for rule, make in rules.items():
        missing = make().requires - capabilities_of(model)
        if missing:
            log(f"{network.name}: {rule} skipped, the network lacks {', '.join(sorted(missing))}")
        else:
            runnable[rule] = make
    cases = {rule: TextCase(network.name, rule) for rule in runnable}
    order = random.Random(seed)
    for trial in range(trials):
        names = list(runnable)
        order.shuffle(names)
        for name in names:
            clock = time_steps(runnable[name](), model, tokens, mask_id, steps)
            case = cases[name]
            case.overhead.append(statistics.median(clock.step_seconds))
            case.forward.append(statistics.median(clock.forward_seconds))
            log(f"{network.name} trial {trial + 1}/{trials} {name}: step {1e3 * case.overhead[-1]:.2f} ms, forward "
                f"{1e3 * case.forward[-1]:.1f} ms ({case.ratio[-1]:.2%})")
    return list(cases.values())

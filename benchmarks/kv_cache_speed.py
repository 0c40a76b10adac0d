"""Wall clock of Fast-dLLM's approximate KV caches (`cache=none|prefix|dual`) and of block diffusion's exact cache
(`block`, Fast-dLLM v2's decoding) at equal NFE, on a random-weight LLaDA-architecture `DiffusionLM`.

Every cache mode runs the same fixed-steps sampler (`StepsSampler(steps=k, block_length=b)`), so each does exactly
the same number of forwards per row (blocks x k) and reveals the same number of tokens per step; only what a
forward computes differs (`none`: the whole canvas; `prefix`: the block and everything right of it; `dual`: the
block). `block` decodes the same canvas with the same weights made block-causal (`attention_block`, as Fast-dLLM
v2 attends) by `BlockDiffusionSampler`: k - 1 fixed steps inside each block plus the forward that commits it to
the exact cache (and predicts the next block's first token), so it too spends k forwards a block when the prompt
and the answer are whole blocks; its forwards run only the block against the cache.
The weights are random: the tokens are meaningless, the time of a forward does not depend on them, and the fixed
schedule makes the work data-independent.

Timing: `torch.no_grad` (inside `Sampler.sample`), a warm-up generation per mode at batch 1, then `repeats`
rounds; a round times one whole generation per (batch, mode), the modes in an order rotated from round to round,
so that drift on a shared machine falls on every mode alike. Ratios are taken within a round (the same minutes
of the machine) and their median reported beside the ratio of medians. The network's own time is measured
apart (a timing wrapper around it), so the share of the sampler loop is visible.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mdmkit.analysis.pages import stamp
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.samplers import BlockDiffusionSampler, ForwardCounter, Sampler, StepsSampler

MODES = ("none", "prefix", "dual")  # the masked loop's cache modes
BLOCK = "block"  # block diffusion with its exact cache
SPEED_MODES = (*MODES, BLOCK)


@dataclass(frozen=True)
class SpeedSetup:
    """What one speed run measures: canvas, schedule, batches and repeats."""

    prompt: int = 512
    answer: int = 256
    block_length: int = 32
    steps_per_block: int = 8
    batches: tuple[int, ...] = (1, 8)
    repeats: int = 3
    seed: int = 0
    device: str = "cpu"  # cuda: timings synchronise the GPU
    dtype: str = "float32"

    @property
    def nfe(self) -> int:
        """Forwards per row: blocks x steps per block (the same for every mode)."""
        return -(-self.answer // self.block_length) * self.steps_per_block


def llada_like(d_model: int = 512, n_layers: int = 6, n_heads: int = 8, mlp_hidden: int = 1536,
               vocab_size: int = 4096, max_positions: int = 4096) -> DiffusionLMConfig:
    """LLaDA-8B's architecture (pre-RMSNorm, rotary with theta 500000 in float32, multi-head attention, SwiGLU
    with 3x hidden, untied output layer, no biases) at a size given by the arguments."""
    return DiffusionLMConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                             n_kv_heads=n_heads, mlp_hidden=mlp_hidden, mask_id=vocab_size - 1,
                             rope_theta=500000.0, max_positions=max_positions, tie_embeddings=False)


def random_network(config: DiffusionLMConfig, seed: int = 0, device: str = "cpu",
                   dtype: str = "float32") -> DiffusionLM:
    """A `DiffusionLM` with random weights, in eval mode, on `device` in `dtype`."""
    torch.manual_seed(seed)
    return DiffusionLM(config).eval().to(device=device, dtype=getattr(torch, dtype))


class _TimedNetwork:
    """The network as the forward counter sees it, timing each call (the sampler loop is the rest)."""

    def __init__(self, network: DiffusionLM) -> None:
        self.network = network
        self.attention, self.shifted_logits = network.attention, network.shifted_logits  # its declared pattern
        self.capabilities = network.capabilities
        self.n_layers = network.n_layers
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = self.network(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return out


@dataclass
class Generation:
    """One timed generation: wall and forward seconds, forwards and computed tokens summed over rows."""

    seconds: float
    forward_seconds: float
    nfe: int
    computed_tokens: int


def canvas(setup: SpeedSetup, batch: int, vocab_size: int, mask_id: int) -> torch.Tensor:
    """`batch` rows of `prompt` random tokens (never the mask) followed by `answer` masks."""
    generator = torch.Generator().manual_seed(setup.seed)
    prompt = torch.randint(0, vocab_size, (batch, setup.prompt), generator=generator)
    prompt = torch.where(prompt == mask_id, 0, prompt)
    return torch.cat([prompt, torch.full((batch, setup.answer), mask_id)], dim=1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(network: DiffusionLM, tokens: torch.Tensor, mode: str, setup: SpeedSetup) -> Generation:
    """Fill `tokens` with `cache=mode` (or block diffusion) and time it (on a GPU the forward share is only
    approximate: a forward's time is its launch unless the sampler waits on its result)."""
    sampler = mode_sampler(mode, setup)
    timed = _TimedNetwork(block_causal(network, setup.block_length) if mode == BLOCK else network)
    counter = ForwardCounter(timed, tokens.shape[0])  # type: ignore[arg-type]
    tokens = tokens.to(setup.device)
    _synchronize(tokens.device)
    start = time.perf_counter()
    sampler.sample(counter, tokens, network.mask_id)
    _synchronize(tokens.device)
    seconds = time.perf_counter() - start
    return Generation(seconds, timed.seconds, int(counter.nfe.sum()), int(counter.tokens.sum()))


def block_causal(network: DiffusionLM, block: int) -> DiffusionLM:
    """The same modules and weights, attending block-causally in blocks of `block` (Fast-dLLM v2's pattern)."""
    twin = copy.copy(network)
    twin.config = replace(network.config, attention_block=block)
    return twin


def mode_sampler(mode: str, setup: SpeedSetup) -> Sampler:
    """The fixed-steps sampler of `mode`: k steps a block in the masked loop, or k - 1 and a commit (block)."""
    if mode == BLOCK:
        rule = StepsSampler(steps=max(1, setup.steps_per_block - 1))
        return BlockDiffusionSampler(block_size=setup.block_length, sub_block=setup.block_length, rule=rule)
    return StepsSampler(steps=setup.steps_per_block, block_length=setup.block_length, cache=mode)  # type: ignore[arg-type]


def _rotated(modes: tuple[str, ...], shift: int) -> list[str]:
    shift %= len(modes)
    return [*modes[shift:], *modes[:shift]]


def run_speed(network: DiffusionLM, setup: SpeedSetup, modes: tuple[str, ...] = SPEED_MODES,
              log: Any = print) -> dict[int, dict[str, list[Generation]]]:
    """Every (batch, mode) generation of every round, after the warm-up: {batch: {mode: [Generation, ...]}}."""
    vocab = network.vocab_size
    for mode in modes:  # warm-up
        generate(network, canvas(setup, 1, vocab, network.mask_id), mode, setup)
    log(f"warm-up done ({', '.join(modes)} at batch 1)")
    runs: dict[int, dict[str, list[Generation]]] = {b: {m: [] for m in modes} for b in setup.batches}
    for round_ in range(setup.repeats):
        for batch in setup.batches:
            tokens = canvas(setup, batch, vocab, network.mask_id)
            for mode in _rotated(modes, round_):
                run = generate(network, tokens, mode, setup)
                runs[batch][mode].append(run)
                log(f"round {round_ + 1}/{setup.repeats} batch {batch} {mode}: {run.seconds:.2f} s "
                    f"({1e3 * run.seconds / (batch * setup.answer):.2f} ms/token)")
    return runs


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_repeat": values}


def summarize(runs: dict[int, dict[str, list[Generation]]], setup: SpeedSetup,
              baseline: str = "none") -> list[dict[str, Any]]:
    """One entry per (batch, mode): ms per generated token, the forward share, NFE and computed tokens per
    forward, and the speed-up over `baseline` (median of per-round ratios, and ratio of medians)."""
    entries = []
    for batch, by_mode in runs.items():
        generated = batch * setup.answer
        reference = by_mode.get(baseline)
        for mode, generations in by_mode.items():
            ms = [1e3 * g.seconds / generated for g in generations]
            entry: dict[str, Any] = {
                "batch": batch, "mode": mode,
                "ms_per_token": _spread(ms),
                "forward_ms_per_token": _spread([1e3 * g.forward_seconds / generated for g in generations]),
                "forward_share": statistics.median(g.forward_seconds / g.seconds for g in generations),
                "nfe_per_row": generations[0].nfe / batch,
                "tokens_per_forward": generations[0].computed_tokens / generations[0].nfe,
                "computed_tokens_per_row": generations[0].computed_tokens / batch,
            }
            if reference is not None:
                ratios = [r.seconds / g.seconds for r, g in zip(reference, generations)]
                entry[f"speedup_over_{baseline}"] = _spread(ratios)
                entry[f"speedup_over_{baseline}_of_medians"] = (
                    statistics.median(r.seconds for r in reference) / statistics.median(g.seconds for g in generations))
            entries.append(entry)
    return entries


def speed_record(network: DiffusionLM, setup: SpeedSetup, entries: list[dict[str, Any]],
                 command: str) -> dict[str, Any]:
    """The speed part of the page's JSON: the command that timed it, network, setup, threads and the entries."""
    return {
        "command": command,
        **stamp(),
        "network": {"architecture": "DiffusionLM (LLaDA settings), random weights",
                    "parameters": network.num_parameters(), **asdict(network.config)},
        "setup": {**asdict(setup), "nfe_per_row": setup.nfe, "sampler": f"StepsSampler(steps={setup.steps_per_block}, "
                  f"block_length={setup.block_length}, cache=...)",
                  "block_sampler": f"BlockDiffusionSampler(block_size={setup.block_length}, sub_block="
                                   f"{setup.block_length}, rule=StepsSampler(steps={setup.steps_per_block - 1}))"},
        "threads": torch.get_num_threads(),
        "entries": entries,
    }

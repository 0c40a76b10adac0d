"""The LLM path at real size: time per forward, tokens/s and peak memory of `cache=none|prefix|dual` and block
diffusion, each forward beside its roofline, and the host synchronisations of the step loop.

The networks are mdmkit's native `DiffusionLM` at the shapes of LLaDA-8B-Instruct, Dream-v0-Instruct-7B, Fast-dLLM
v2 7B, LLaDA2.0-mini (a mixture of experts), SDAR-8B and SDAR-4B (each model kind's `shapes`, from their hub
config.json values), with seeded random weights made directly on the device in the run's dtype (no download, and no
float32 copy on the host). Random weights make confidence-based reveal counts meaningless, so every mode runs the
same fixed schedule, `steps_per_block` forwards per block of 32, and does the same NFE; only what a forward computes
differs: `none` the whole canvas, `prefix` the block and what follows it against the cache, `dual` the block against
the cache, `block` (block diffusion: the network attending block-causally, Fast-dLLM v2's decoding) the block against
its exact cache of finished blocks. A block-causal network decodes in blocks no larger than it was trained in
(`own_block`: SDAR's 4, its forwards per block cut in proportion).

`VARIANTS` are decoders that run on another case's network: LLaDA2.1-mini is LLaDA2.0-mini's network with LLaDA2.1's
decoder (`sampler=llada2_1`), whose forwards have LLaDA2.0's shapes but whose loop adds token edits (T2T) and a post
step per full block, so its own case times that loop: `none` is its generate (each forward recomputing the window up
to the block's end), `block` its cached form (`sampler=llada2_1_cached`), both at a fixed schedule. DiffusionGemma
(mode `canvas`, transformers' network) is `benchmarks.llm_path_canvas`.

Timing: each forward of the network is bracketed by CUDA events (on a CPU, by the clock: its kernels run
synchronously), summed after the generation; the generation's wall clock includes everything else (the sampler's
work and the host waiting on the GPU). A host synchronisation is any call that makes Python wait for a tensor's
value (`.item()`, `.tolist()`, `.cpu()`, `bool()`/`int()`/`float()` of a tensor, `nonzero`, `torch.equal`): counted by
wrapping those methods for one generation, apart for the loop and inside the network. Rooflines:
`benchmarks.llm_roofline` (a mixture of experts computes its active parameters, reads the experts it touches).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from benchmarks.llm_roofline import Forward, canvas_seconds, forward_seconds
from benchmarks.roofline import Hardware
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.models.llm.registry import model_kinds
from mdmkit.samplers import (
    BlockDiffusionSampler,
    EditingSampler,
    ForwardCounter,
    Llada21Sampler,
    M2TSampler,
    StepsSampler,
)
from mdmkit.samplers.core.protocol import Sampler

MODES = ("none", "prefix", "dual", "block", "canvas")  # canvas: a revisable-canvas network's only mode
CACHES = ("prefix", "dual")  # the approximate caches, for bidirectional networks only

# each model kind's real-size shapes (its record's `shapes`: the hub config.json values, max_positions covering
# prompt 1024 + 256)
PRESETS = {name: shape for kind in model_kinds() for name, shape in kind.shapes.items()}
# decoders timed on another case's network: name -> (the preset whose network runs, the decoder)
VARIANTS = {"llada2.1-mini": ("llada2-mini", "editing")}

# dense bf16 tensor-core rate and HBM bandwidth from the vendors' data sheets (SXM parts)
CARDS = {
    "H200": Hardware("NVIDIA H200 SXM (data sheet: 989 TFLOP/s dense bf16, 4.8 TB/s)", 989e12, 989e12, 4.8e12),
    "H100": Hardware("NVIDIA H100 SXM (data sheet: 989 TFLOP/s dense bf16, 3.35 TB/s)", 989e12, 989e12, 3.35e12),
    "A100": Hardware("NVIDIA A100 80GB SXM (data sheet: 312 TFLOP/s dense bf16, 2.04 TB/s)", 312e12, 312e12,
                     2.039e12),
}


def card_of(device: torch.device) -> Hardware | None:
    """The data-sheet figures of the GPU at `device` (None: a CPU or a card not listed in `CARDS`)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((hardware for key, hardware in CARDS.items() if key in name), None)


def step_seconds(step: Callable[[], None], count: int, device: torch.device) -> list[float]:
    """The time of each of `count` calls of `step`: CUDA events on a GPU (the device's time, read once at the end,
    so the host never waits between steps), the clock on a CPU (its kernels run synchronously)."""
    if device.type != "cuda":
        seconds = []
        for _ in range(count):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        return seconds
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for begin, end in events:
        begin.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    return [begin.elapsed_time(end) / 1e3 for begin, end in events]


def measured_card(device: torch.device, dtype: torch.dtype, name: str) -> Hardware:
    """Roofline figures measured on `device` where no data sheet is at hand (a CPU): the best rate of a large square
    matmul in `dtype` as the peak, the best copy of a large buffer (read + write) as the bandwidth. Attainable
    figures, so a forward's distance from this roofline is what the implementation leaves, not the silicon."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    flops = 2.0 * n**3 / min(step_seconds(lambda: a @ b, 6, device)[1:])  # the first warms up
    source = torch.empty((2**29 if device.type == "cuda" else 2**26) // 4, device=device)  # 2 GiB / 64 MiB
    target = torch.empty_like(source)
    bandwidth = 2 * source.numel() * 4 / min(step_seconds(lambda: target.copy_(source), 6, device)[1:])
    label = f"{name}, measured: {flops / 1e9:,.0f} GFLOP/s {str(dtype).removeprefix('torch.')} matmul, " \
            f"{bandwidth / 1e9:,.1f} GB/s copy"
    return Hardware(label, flops, flops, bandwidth)


def scaled(config: DiffusionLMConfig, width: int, layers: int) -> DiffusionLMConfig:
    """`config` at a width and depth a CPU can run: fewer heads of the same size (a set `head_width`, wider than
    d_model / n_heads as Qwen3-4B's, travels with them), the real vocabulary."""
    heads = max(1, config.n_heads * width // config.d_model)
    kv_heads = max(1, heads * config.n_kv_heads // config.n_heads)
    while heads % kv_heads:
        kv_heads -= 1
    d_model = heads * (width // heads)
    moe = config.moe
    if moe is not None:  # the experts' count and routing kept, each expert as much narrower as the network
        moe = replace(moe, expert_hidden=max(1, moe.expert_hidden * width // config.d_model),
                      shared_hidden=moe.shared_hidden * width // config.d_model,
                      layers=tuple(layer for layer in moe.layers if layer < layers))
    head = config.head_dim if config.head_width is not None else d_model // heads
    rotary = None if config.rotary_dim is None else max(2, config.rotary_dim * head // config.head_dim)
    return replace(config, d_model=d_model, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                   mlp_hidden=config.mlp_hidden * width // config.d_model, moe=moe, rotary_dim=rotary)


def own_block(config: DiffusionLMConfig, block: int, steps_per_block: int) -> tuple[int, int]:
    """The block and forwards per block a network decodes with: a block-causal network in blocks no larger than
    those it was trained in (SDAR's 4 under a run's 32), its forwards per block cut in proportion (at least 2: a step
    and block diffusion's committing forward), so that forwards per answer token stay the run's where they can."""
    trained = config.attention_block
    if trained is None or trained >= block:
        return block, steps_per_block
    return trained, max(2, steps_per_block * trained // block)


def random_llm(config: DiffusionLMConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> DiffusionLM:
    """A `DiffusionLM` of `config` with N(0, 0.02) weights (norms at 1, expert biases 0), allocated on `device` in
    `dtype` only."""
    with torch.device("meta"):
        network = DiffusionLM(config).to(dtype)
    network = network.to_empty(device=device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
        for buffer in network.buffers():  # the routers' expert biases
            buffer.zero_()
    return network.eval()


class ForwardClock:
    """The network as the forward counter sees it, timing each call and noting its shape."""

    def __init__(self, network: DiffusionLM, syncs: SyncCounter | None = None) -> None:
        self.network, self.syncs = network, syncs
        self.capabilities, self.n_layers, self.mask_id = network.capabilities, network.n_layers, network.mask_id
        self.attention, self.shifted_logits = network.attention, network.shifted_logits  # its declared pattern
        self.cuda = next(network.parameters()).device.type == "cuda"
        self.forwards: list[Forward] = []
        self._events: list[tuple[Any, Any]] = []

    def __call__(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        cache, columns = kwargs.get("cache"), kwargs.get("logits_at")
        past = 0 if cache is None else cache.length
        logits = tokens.shape[1] if columns is None else columns.stop - columns.start
        self.forwards.append(Forward(tokens.shape[0], tokens.shape[1], past + tokens.shape[1], logits))
        with self.syncs.inside() if self.syncs is not None else nullcontext():
            if not self.cuda:
                start = time.perf_counter()
                out = self.network(tokens, *args, **kwargs)
                self.forwards[-1].seconds = time.perf_counter() - start
                return out
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = self.network(tokens, *args, **kwargs)
            end.record()
            self._events.append((begin, end))
            return out

    def settle(self) -> None:
        """Read the GPU's forward times (after the generation's final synchronisation)."""
        for forward, (begin, end) in zip(self.forwards[len(self.forwards) - len(self._events):], self._events):
            forward.seconds = begin.elapsed_time(end) / 1e3
        self._events.clear()


_SYNCING = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")


@dataclass
class SyncCounter:
    """Host synchronisations while `counting()` is open, split into the step loop's and the network's."""

    loop: int = 0
    network: int = 0
    _inside: int = field(default=0, repr=False)

    @contextmanager
    def inside(self) -> Iterator[None]:
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1

    def _note(self) -> None:
        if self._inside:
            self.network += 1
        else:
            self.loop += 1

    @contextmanager
    def counting(self) -> Iterator[SyncCounter]:
        originals = {name: getattr(torch.Tensor, name) for name in _SYNCING}
        original_equal, original_nonzero = torch.equal, torch.nonzero

        def counted(function: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self._note()
                return function(*args, **kwargs)
            return wrapper

        try:
            for name, method in originals.items():
                setattr(torch.Tensor, name, counted(method))
            torch.equal, torch.nonzero = counted(original_equal), counted(original_nonzero)
            yield self
        finally:
            for name, method in originals.items():
                setattr(torch.Tensor, name, method)
            torch.equal, torch.nonzero = original_equal, original_nonzero


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def canvas(prompt: int, answer: int, batch: int, vocab_size: int, mask_id: int, seed: int = 0) -> torch.Tensor:
    """`batch` rows of `prompt` random tokens (never the mask) followed by `answer` masks, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, prompt), generator=generator)
    tokens = torch.where(tokens == mask_id, 0, tokens)
    return torch.cat([tokens, torch.full((batch, answer), mask_id)], dim=1)


@dataclass
class Generation:
    """One timed generation and what it did."""

    seconds: float
    forwards: list[Forward]
    nfe_per_row: float
    loop_syncs: int
    network_syncs: int
    peak_bytes: int | None

    @property
    def forward_seconds(self) -> float:
        return sum(f.seconds for f in self.forwards)


def generate(network: Any, tokens: torch.Tensor, sampler: Sampler, count_syncs: bool = True,
             clock_type: Callable[..., Any] = ForwardClock) -> Generation:
    """Fill `tokens` (moved to the network's device) with `sampler`, timed; host syncs counted if asked (the
    counting wraps tensor methods, a small cost of its own: a timed run that matters leaves it off). `clock_type`
    times the network's passes (a canvas network's: `llm_path_canvas.CanvasClock`)."""
    device = next(network.parameters()).device
    syncs = SyncCounter()
    clock = clock_type(network, syncs if count_syncs else None)
    counter = ForwardCounter(clock, tokens.shape[0])  # type: ignore[arg-type]
    tokens = tokens.to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    with syncs.counting() if count_syncs else nullcontext():
        sampler.sample(counter, tokens, network.mask_id)
    synchronize(device)
    seconds = time.perf_counter() - start
    clock.settle()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Generation(seconds, clock.forwards, float(counter.nfe.float().mean()), syncs.loop, syncs.network, peak)


def roofline_seconds(forwards: list[Forward], config: Any, hardware: Hardware, element_bytes: int) -> float:
    """The roofline time of these forwards on `hardware` (`benchmarks.llm_roofline`): of a `DiffusionLM` of
    `config`, or of a DiffusionGemma network whose text config `config` is."""
    if isinstance(config, DiffusionLMConfig):
        return sum(forward_seconds(config, forward, hardware, element_bytes) for forward in forwards)
    return sum(canvas_seconds(config, forward, hardware, element_bytes) for forward in forwards)


def _editing(steps: int, block: int) -> EditingSampler:
    """LLaDA2.1's rule at a fixed schedule: M2T reveals of exactly ceil(block / steps) a step (its tau at 1, which
    no probability exceeds), T2T edits at the model card's Quality threshold (0.5), and one post step per full
    block (a post step that edits nothing ends the block, so one is always taken whatever random weights edit)."""
    reveal = M2TSampler(tau=1.0, num_to_transfer=-(-block // max(1, steps)))
    return EditingSampler(base=reveal, threshold=0.5, post_steps=1)


def fixed_sampler(mode: str, steps_per_block: int, block: int, decoder: str = "masked") -> Sampler:
    """`steps_per_block` forwards a block in every mode: the masked loop's fixed steps under `cache=mode`, or
    (`block`) block diffusion's `steps_per_block - 1` steps and the forward that commits the block to its exact
    cache, when the prompt and the answer are whole blocks. `decoder="editing"`: LLaDA2.1's decoder (`_editing`),
    its post step and (`block`) commit included in the count."""
    if decoder == "editing" and mode == "block":
        rule = _editing(steps_per_block - 2, block)
        return BlockDiffusionSampler(block_size=block, sub_block=block, rule=rule, commit_reveals=False)
    if decoder == "editing":
        return Llada21Sampler(block_size=block, rule=_editing(steps_per_block - 1, block))
    if mode == "block":
        rule = StepsSampler(steps=max(1, steps_per_block - 1))
        return BlockDiffusionSampler(block_size=block, sub_block=block, rule=rule)
    return StepsSampler(steps=steps_per_block, block_length=block, cache=mode)  # type: ignore[arg-type]


def network_for(network: DiffusionLM, mode: str, block: int) -> DiffusionLM | None:
    """The network `mode` decodes: a bidirectional one's modules attending block-causally for `block` (the same
    weights, as Fast-dLLM v2 attends), itself otherwise; None where the mode does not apply (the approximate caches
    on a block-causal network, which block diffusion caches exactly)."""
    causal = network.config.attention_block is not None
    if mode == "canvas" or (mode in CACHES and causal):
        return None
    if mode != "block" or causal:
        return network
    twin = copy.copy(network)
    twin.config = replace(network.config, attention_block=block)
    return twin


def case_record(generation: Generation, *, model: str, prompt: int, answer: int, batch: int, mode: str,
                config: DiffusionLMConfig, element_bytes: int, hardware: Hardware | None,
                predict: tuple[DiffusionLMConfig, Hardware] | None = None) -> dict[str, Any]:
    """One (model, prompt, batch, mode) measurement as the page's JSON keeps it; `predict` (a network's real
    config and a card) adds the roofline of the same forwards at that size in bf16: the bound a scaled-down run
    stands in for."""
    n = len(generation.forwards)
    record = {
        "model": model, "prompt": prompt, "answer": answer, "batch": batch, "mode": mode,
        "seconds": generation.seconds, "tokens_per_s": batch * answer / generation.seconds,
        "forwards": n, "nfe_per_row": generation.nfe_per_row,
        "ms_per_forward": 1e3 * generation.forward_seconds / n,
        "loop_share": 1 - generation.forward_seconds / generation.seconds,
        "peak_gib": None if generation.peak_bytes is None else generation.peak_bytes / 2**30,
    }
    if hardware is not None:
        roofline = roofline_seconds(generation.forwards, config, hardware, element_bytes)
        record.update(roofline_ms_per_forward=1e3 * roofline / n,
                      forward_over_roofline=generation.forward_seconds / roofline)
    if predict is not None:
        predicted = roofline_seconds(generation.forwards, *predict, element_bytes=2)
        record.update(predicted_ms_per_forward=1e3 * predicted / n, predicted_tokens_per_s=batch * answer / predicted)
    return record

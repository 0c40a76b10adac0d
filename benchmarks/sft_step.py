"""One fine-tuning step of a LLaDA-architecture network, measured: its time and the memory it needs.

The network is mdmkit's `DiffusionLM` with seeded random weights made directly on the device
(`benchmarks.llm_path.random_llm`: no download, no float32 copy on the host when the weights are bf16). A step is
the one `SFTModule` takes under Lightning in `experiment=llada_sft`: LLaDA's SFT loss (`MaskedDiffusionLoss(
stratified=False)`) through the network, backward, gradients clipped at norm 1, AdamW over the trainable
parameters (`OptimConfig().adamw`), gradients cleared. LoRA is `mdmkit.models.llm.lora.add_lora`, as `sft.lora_r`
adds it, and gradient checkpointing is `DiffusionLM.gradient_checkpointing`, as `sft.gradient_checkpointing` sets it.

Each case builds its own network inside its memory window, so its peak holds everything a step needs: weights,
gradients, AdamW's two moments and the activations kept for backward. GPU: `torch.cuda.max_memory_allocated` over
the case, less what was allocated before it. CPU: the kernel's high-water mark of the resident set (VmHWM, reset
through /proc/self/clear_refs) less the resident set at the case's start, taken after freed heap memory is handed
back (`malloc_trim`) so that memory left by an earlier case neither hides nor inflates this one's: exact, not sampled.
"""

from __future__ import annotations

import ctypes
import gc
import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.llm_path import PRESETS as LLM_PRESETS
from benchmarks.llm_path import random_llm, step_seconds
from mdmkit.core.seeding import seeded_generator
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.models.llm.lora import LoRA, add_lora
from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss
from mdmkit.training.optim import OptimConfig

_LLADA_8B = LLM_PRESETS["llada-8b"]
# LLaDA-8B's rotary base, head size (128), multi-head attention and MLP ratio (3x) at smaller widths and depths.
# llada-1b, for a GPU: its vocabulary too, 1.17B parameters, 56% of them in the blocks. reduced, for a CPU: a
# 16384-token vocabulary (the real one, 126464, made a step on 2 cores over 10x longer and put 90% of the weights
# in the embedding and output layer), 30.4M parameters, 45% in the blocks. tiny: for tests.
PRESETS = {
    "llada-1b": replace(_LLADA_8B, d_model=2048, n_layers=12, n_heads=16, n_kv_heads=16, mlp_hidden=6144),
    "reduced": replace(_LLADA_8B, vocab_size=16384, mask_id=16383, d_model=512, n_layers=4, n_heads=4, n_kv_heads=4,
                       mlp_hidden=1536),
    "tiny": replace(_LLADA_8B, vocab_size=512, mask_id=511, d_model=64, n_layers=2, n_heads=2, n_kv_heads=2,
                    mlp_hidden=192),
}
CASES = (("full", False), ("full", True), ("lora", False), ("lora", True))  # (method, gradient checkpointing)


@dataclass(frozen=True)
class Setup:
    """What every case shares: the network's shape, the batch, the adapters' rank and the precision."""

    config: DiffusionLMConfig
    device: torch.device
    batch: int
    length: int
    lora_r: int
    steps: int
    warmup: int
    bf16: bool  # bf16 autocast; full fine-tuning keeps float32 weights, LoRA's frozen base is made in bf16


def sft_batch(config: DiffusionLMConfig, batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens (never the mask) [batch, length] and their answer mask: the first quarter of each row is a
    prompt, never masked, the rest the answer (what LLaDA's SFT masks and scores)."""
    tokens = torch.randint(0, config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))
    tokens = torch.where(tokens == config.mask_id, 0, tokens)
    answer = (torch.arange(length) >= length // 4).expand(batch, length)
    return tokens, answer.clone()


def parameter_count(config: DiffusionLMConfig) -> int:
    """The network's parameters, counted on the meta device (no memory)."""
    with torch.device("meta"):
        return DiffusionLM(config).num_parameters()


def build(setup: Setup, method: str, checkpointing: bool) -> DiffusionLM:
    """The network of one case, in training mode: every weight trainable, or frozen under rank-r adapters."""
    dtype = torch.bfloat16 if setup.bf16 and method == "lora" else torch.float32
    network = random_llm(setup.config, setup.device, dtype).train()
    network.gradient_checkpointing = checkpointing
    return network if method == "full" else add_lora(network, LoRA(setup.lora_r))


def _status_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (None where there is no /proc: not Linux)."""
    try:
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1))
    except (OSError, AttributeError):
        return None


class PeakMemory:
    """The peak memory growth, in bytes, from `__init__` to `peak()` (see the module's docstring for how)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            self.start = torch.cuda.memory_allocated(device)
            return
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            pass
        self.start = _status_kib("VmRSS")

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.start
        high = _status_kib("VmHWM")
        return None if high is None or self.start is None else (high - self.start) * 1024


@contextmanager
def saved_for_backward(storages: dict[int, int]) -> Iterator[None]:
    """Note in `storages` (address -> bytes) the storage of every tensor autograd keeps for backward inside the
    block: a step's activations at the end of its forward, exact where the allocator's peak is not (under
    checkpointing, the blocks' inputs: the blocks' insides are saved by checkpoint's own hooks, and recomputed)."""

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def measure_case(setup: Setup, method: str, checkpointing: bool, tokens: torch.Tensor,
                 answer_mask: torch.Tensor) -> dict[str, Any]:
    """One case's row: median step time over `setup.steps` after `setup.warmup` (the first step alone apart: it
    also counts what is saved for backward), tokens/s over every token of the batch, peak memory, the bytes saved for
    backward (the weights themselves aside; under bf16 autocast their bf16 copies count), the parameters trained and
    the final loss."""
    device = setup.device
    tokens, answer_mask = tokens.to(device), answer_mask.to(device)
    memory = PeakMemory(device)
    network = build(setup, method, checkpointing)
    optimizer = OptimConfig().adamw(network)
    trained = [p for p in network.parameters() if p.requires_grad]
    objective, noise = MaskedDiffusionLoss(stratified=False), seeded_generator(0, device)
    losses: list[torch.Tensor] = []

    def step() -> None:
        # grad on whatever the caller's mode (an imported library may have switched it off for the process)
        with torch.enable_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=setup.bf16):
            loss, _ = objective(network, tokens, answer_mask, network.mask_id, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    storages: dict[int, int] = {}
    with saved_for_backward(storages):
        first = step_seconds(step, 1, device)[0]
    weights = {p.untyped_storage().data_ptr() for p in network.parameters()}
    step_seconds(step, setup.warmup, device)
    seconds = statistics.median(step_seconds(step, setup.steps, device))
    frozen = [p for p in network.parameters() if not p.requires_grad]
    return {"method": method, "checkpointing": checkpointing,
            "lora_r": setup.lora_r if method == "lora" else None,
            "tokens_per_s": setup.batch * setup.length / seconds, "step_s": seconds, "first_step_s": first,
            "peak_bytes": memory.peak(), "saved_bytes": sum(n for at, n in storages.items() if at not in weights),
            "trainable_parameters": sum(p.numel() for p in trained),
            "trainable_dtype": str(trained[0].dtype).removeprefix("torch."),
            "frozen_dtype": str(frozen[0].dtype).removeprefix("torch.") if frozen else None,
            "final_loss": float(losses[-1])}

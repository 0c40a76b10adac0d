"""Presets give the same tokens as the reference algorithms they follow, re-stated here step by step.

Each reference below is a plain single-row transcription of the published decoding rule (LLaDA's
low-confidence remasking, Dream's timestep schedule, Fast-dLLM's threshold and factor rules), kept apart
from the library's batched loop so the two can disagree.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import compose_config
from fakes import random_transformer

from mdmkit.core.config import build
from mdmkit.samplers import ForwardCounter
from mdmkit.samplers.ordering import entropy

V, MASK, PROMPT, GEN = 9, 8, 4, 12


network = partial(random_transformer, V, PROMPT + GEN, 1)


def prompts(rows: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    x = torch.full((rows, PROMPT + GEN), MASK)
    x[:, :PROMPT] = torch.randint(0, MASK, (rows, PROMPT), generator=generator)
    return x


def predict(net: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = net(x[None])[0]
    logits[:, MASK] = -torch.inf
    probs = logits.softmax(-1)
    return probs, probs.argmax(-1)


def llada_reference(net, x, steps_per_block: int, block_length: int) -> torch.Tensor:
    """LLaDA generate(): per block, a fixed number of tokens per step, lowest confidence stays masked."""
    x = x.clone()
    for start in range(PROMPT, PROMPT + GEN, block_length):
        block = slice(start, start + block_length)
        n = int((x[block] == MASK).sum())
        per_step = [n // steps_per_block + (1 if i < n % steps_per_block else 0) for i in range(steps_per_block)]
        for count in per_step:
            probs, x0 = predict(net, x)
            confidence = probs.gather(-1, x0[:, None])[:, 0]
            confidence[: start] = -torch.inf
            confidence[start + block_length :] = -torch.inf
            confidence[x != MASK] = -torch.inf
            chosen = confidence.topk(count).indices
            x[chosen] = x0[chosen]
    return x


def dream_reference(net, x, steps: int, alg: str, eps: float = 1e-3) -> torch.Tensor:
    """Dream diffusion_generate(): reveal int(n_masked * (1 - s / t)) per step, the best by `alg`'s score."""
    x = x.clone()
    times = torch.linspace(1, eps, steps + 1, dtype=torch.float64)
    for i in range(steps):
        masked = torch.nonzero(x == MASK).flatten()
        probs, x0 = predict(net, x)
        score = {
            "maskgit_plus": probs.max(-1).values,
            "topk_margin": probs.topk(2, -1).values[:, 0] - probs.topk(2, -1).values[:, 1],
            "entropy": -entropy(probs),
        }[alg][masked]
        count = len(masked) if i == steps - 1 else int(len(masked) * (1 - times[i + 1] / times[i]))
        chosen = masked[score.topk(count).indices]
        x[chosen] = x0[chosen]
    return x


def fastdllm_reference(net, x, block_length: int, tau: float | None = None, factor: float | None = None):
    """Fast-dLLM parallel decoding inside semi-AR blocks, by threshold or by factor; at least one per step."""
    x = x.clone()
    for start in range(PROMPT, PROMPT + GEN, block_length):
        while (x[start : start + block_length] == MASK).any():
            probs, x0 = predict(net, x)
            masked = torch.nonzero(x[start : start + block_length] == MASK).flatten() + start
            confidence = probs.max(-1).values[masked]
            ranked = confidence.argsort(descending=True)
            if tau is not None:
                count = max(1, int((confidence >= tau).sum()))
            else:
                count = max([1] + [n for n in range(1, len(ranked) + 1)
                                   if (n + 1) * (1 - confidence[ranked[n - 1]]) < factor])
            chosen = masked[ranked[:count]]
            x[chosen] = x0[chosen]
    return x


def run_preset(name: str, overrides: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={name}", *overrides]).sampler, "sampler")
    x = prompts()
    counter = ForwardCounter(network(), len(x))
    return sampler.sample(counter, x, MASK).tokens, counter.nfe


def test_llada_preset_matches_llada_generate() -> None:
    out, nfe = run_preset("llada", ["sampler.block_length=4", "sampler.steps=2"])
    net, x = network(), prompts()
    for row in range(len(x)):
        assert torch.equal(out[row], llada_reference(net, x[row], steps_per_block=2, block_length=4))
    assert nfe.tolist() == [2 * 3] * len(x)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_presets_match_dream_generate(alg: str) -> None:
    out, nfe = run_preset(f"dream_{alg}", ["sampler.steps=4"])
    net, x = network(), prompts()
    # 12 masked over 4 steps reveals 2, 4, 3, 3 (no step reveals zero, where the two would differ)
    for row in range(len(x)):
        assert torch.equal(out[row], dream_reference(net, x[row], steps=4, alg=alg))
    assert nfe.tolist() == [4] * len(x)


@pytest.mark.parametrize("name, kwargs", [("fastdllm_threshold", {"tau": 0.2}), ("fastdllm_factor", {"factor": 1.9})])
def test_fastdllm_presets_match_fastdllm_decoding(name: str, kwargs: dict) -> None:
    key, value = next(iter(kwargs.items()))
    out, _ = run_preset(name, ["sampler.block_length=6", f"sampler.{key}={value}"])
    net, x = network(), prompts()
    for row in range(len(x)):
        assert torch.equal(out[row], fastdllm_reference(net, x[row], block_length=6, **kwargs))

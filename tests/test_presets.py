"""Presets give the same tokens as the reference algorithms they follow, re-stated here step by step.

Each reference below is a plain single-row re-statement of the decoding rule as the reference code applies it
(LLaDA's `generate`, Dream's `diffusion_generate`, Fast-dLLM's `get_transfer_index` and
`get_transfer_index_dynamic`; `factor` is the Fast-dLLM paper's rule), kept apart from the library's batched loop
so the two can disagree. docs/samplers.md says which function of which repository each one follows.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import compose_config
from fakes import random_transformer

from mdmkit.core.config import build
from mdmkit.samplers import ForwardCounter

V, MASK, PROMPT, GEN = 9, 8, 4, 12


network = partial(random_transformer, V, PROMPT + GEN, 1)


def dream_network() -> torch.nn.Module:
    """The same network with the mask token's logit lowered: it keeps a share of every softmax (which the official
    Dream, LLaDA and Fast-dLLM scores include) but is never the argmax at a position revealed here."""
    net = network()
    with torch.no_grad():
        net.head.bias[MASK] -= 1.0
    return net


def prompts(rows: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    x = torch.full((rows, PROMPT + GEN), MASK)
    x[:, :PROMPT] = torch.randint(0, MASK, (rows, PROMPT), generator=generator)
    return x


def predict(net: torch.nn.Module, x: torch.Tensor, mask_in_softmax: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores of the official LLaDA / Fast-dLLM code: the softmax over every token, the mask included, and its
    argmax (on `dream_network` never the mask at a masked position); else the softmax without the mask token."""
    logits = net(x[None])[0]
    if not mask_in_softmax:
        logits[:, MASK] = -torch.inf
    probs = logits.softmax(-1)
    x0 = probs.argmax(-1)
    assert MASK not in x0[x == MASK].tolist()
    return probs, x0


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


def dream_reference(net, x, steps: int, alg: str, eps: float = 1e-3, generator=None) -> torch.Tensor:
    """Dream diffusion_generate(): scores from the softmax over every token (the mask included); step i of
    `steps` reveals int(n_masked * (1 - s / t)) (float32 times) best-scored masked positions, the last step the
    rest; alg='origin' instead reveals each masked position whose uniform draw is below 1 - s / t."""
    x = x.clone()
    times = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = torch.nonzero(x == MASK).flatten()
        probs = net(x[None])[0].softmax(-1)
        confidence, x0 = probs.max(-1)
        top2 = probs.topk(2, -1).values
        fraction = 1 - times[i + 1] / times[i]
        if alg == "origin":
            draws = torch.rand((1, len(x)), generator=generator)[0]
            chosen = masked[draws[masked] < fraction] if i < steps - 1 else masked
        else:
            score = {
                "maskgit_plus": confidence,
                "topk_margin": top2[:, 0] - top2[:, 1],
                "entropy": (probs * (probs + 1e-10).log()).sum(-1),
            }[alg][masked]
            count = len(masked) if i == steps - 1 else int(len(masked) * fraction)
            chosen = masked[score.topk(count).indices]
        assert (x0[chosen] != MASK).all()  # where Dream would write a mask back, mdmkit takes the runner-up
        x[chosen] = x0[chosen]
    return x


def fastdllm_count(confidence: torch.Tensor, tau: float | None, factor: float | None) -> int:
    """How many of a block's masked positions, ranked by `confidence` (descending), one step reveals.

    Threshold (get_transfer_index): the best one, plus every other one with confidence >= tau.
    Factor (get_transfer_index_dynamic): walk the ranked positions while c_(n) >= 1 - f / (n + 1) (the first
    always passes); stop at the first that fails; if that is the last one, take it too.
    """
    ranked = confidence.double().sort(descending=True).values.tolist()
    if tau is not None:
        return max(1, sum(c >= tau for c in ranked))
    count = 0
    for n, c in enumerate(ranked, start=1):
        if n > 1 and c < 1 - factor / (n + 1):
            break
        count = n
    return len(ranked) if count >= len(ranked) - 1 else count


def factor_paper_count(confidence: torch.Tensor, factor: float) -> int:
    """The Fast-dLLM paper's factor rule: the largest n with (n + 1)(1 - c_(n)) < f, at least one."""
    ranked = confidence.sort(descending=True).values.tolist()
    return max([1] + [n for n, c in enumerate(ranked, start=1) if (n + 1) * (1 - c) < factor])


def fastdllm_reference(net, x, block_length: int, count, mask_in_softmax: bool) -> torch.Tensor:
    """Fast-dLLM's generate(): semi-AR blocks, each filled step by step; `count(confidence)` is the rule."""
    x = x.clone()
    for start in range(PROMPT, PROMPT + GEN, block_length):
        while (x[start : start + block_length] == MASK).any():
            probs, x0 = predict(net, x, mask_in_softmax)
            masked = torch.nonzero(x[start : start + block_length] == MASK).flatten() + start
            confidence = probs.max(-1).values[masked]
            chosen = masked[confidence.argsort(descending=True)[: count(confidence)]]
            x[chosen] = x0[chosen]
    return x


def run_preset(name: str, overrides: list[str], net: torch.nn.Module | None = None, rows: int = 4,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={name}", *overrides]).sampler, "sampler")
    x = prompts(rows)
    counter = ForwardCounter(network() if net is None else net, len(x))
    return sampler.sample(counter, x, MASK, generator).tokens, counter.nfe


def test_llada_preset_matches_llada_generate() -> None:
    net, x = dream_network(), prompts()
    out, nfe = run_preset("llada", ["sampler.block_length=4", "sampler.steps=2"], net)
    for row in range(len(x)):
        assert torch.equal(out[row], llada_reference(net, x[row], steps_per_block=2, block_length=4))
    assert nfe.tolist() == [2 * 3] * len(x)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("steps", [4, 16])
def test_dream_presets_match_dream_generate(alg: str, steps: int) -> None:
    out, nfe = run_preset(f"dream_{alg}", [f"sampler.steps={steps}"], dream_network())
    net, x = dream_network(), prompts()
    # 12 masks over 4 steps reveal 2, 4, 3, 3; over 16 steps most steps reveal none, and still run
    for row in range(len(x)):
        assert torch.equal(out[row], dream_reference(net, x[row], steps=steps, alg=alg))
    assert nfe.tolist() == [steps] * len(x)


@pytest.mark.parametrize("seed", range(4))
def test_dream_origin_matches_dream_generate_draw_for_draw(seed: int) -> None:
    # one row: the loop draws one uniform per position and step from the generator, as the reference does
    out, _ = run_preset("dream_origin", ["sampler.steps=6"], dream_network(), rows=1,
                        generator=torch.Generator().manual_seed(seed))
    expected = dream_reference(dream_network(), prompts(1)[0], steps=6, alg="origin",
                               generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out[0], expected)


@pytest.mark.parametrize("name, overrides, count, official", [
    ("fastdllm_threshold", ["sampler.tau=0.2"], partial(fastdllm_count, tau=0.2, factor=None), True),
    ("fastdllm_factor", ["sampler.factor=1.9"], partial(fastdllm_count, tau=None, factor=1.9), True),
    ("factor", ["sampler.factor=1.9", "sampler.block_length=6"], partial(factor_paper_count, factor=1.9), False),
])
def test_fastdllm_presets_match_fastdllm_decoding(name: str, overrides: list[str], count, official: bool) -> None:
    """The code's presets score as the code (the mask token in the softmax); the paper's `factor` as mdmkit's
    other rules (without it)."""
    make = dream_network if official else network
    out, _ = run_preset(name, ["sampler.block_length=6", *overrides], make())
    net, x = make(), prompts()
    for row in range(len(x)):
        assert torch.equal(out[row], fastdllm_reference(net, x[row], block_length=6, count=count,
                                                        mask_in_softmax=official))


def test_the_two_factor_presets_differ_on_this_network() -> None:
    # the code's rule reveals the last masked position with the rest: fewer steps, other tokens
    code, code_nfe = run_preset("fastdllm_factor", ["sampler.factor=1.9", "sampler.block_length=6"])
    paper, paper_nfe = run_preset("factor", ["sampler.factor=1.9", "sampler.block_length=6"])
    assert not torch.equal(code, paper) and (code_nfe <= paper_nfe).all() and (code_nfe < paper_nfe).any()


@pytest.mark.parametrize("preset, overrides", [("llada", ["sampler.steps=2", "sampler.block_length=2"]),
                                               ("fastdllm_threshold", ["sampler.tau=0.99", "sampler.block_length=2"])])
def test_the_official_presets_rank_by_the_softmax_over_every_token(preset: str, overrides: list[str]) -> None:
    """LLaDA's and Fast-dLLM's code score a position by its best token's probability under the softmax over the
    whole vocabulary, the mask included. Answer position 0: best token 0.30 with 0.50 on the mask (0.60 without
    it); position 1: best 0.35, no mass on the mask. The code reveals position 1 first; leaving the mask out of
    the softmax would reveal position 0."""
    from fakes import FixedLogits

    vocab, mask = 4, 3
    probs = torch.full((PROMPT + 2, vocab), 1 / vocab)
    probs[PROMPT] = torch.tensor([0.30, 0.15, 0.05, 0.50])
    probs[PROMPT + 1] = torch.tensor([0.35, 0.33, 0.32, 0.0])
    net = FixedLogits(probs.clamp(min=1e-9).log())
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={preset}", *overrides]).sampler, "sampler")
    x = torch.full((1, PROMPT + 2), mask)
    x[0, :PROMPT] = 0
    sampled = sampler.sample(ForwardCounter(net, 1), x, mask)
    assert sampled.reveal_step[0, PROMPT:].tolist() == [1, 0]

"""Revisable decoding (`sampler=diffusion_gemma`) token for token against transformers' own
`DiffusionGemmaForBlockDiffusion.generate`: canvas noise, multinomial draws and renoising come in the same order and
shapes from generators seeded alike, so tokens, `tokens_per_forward` and each row's decoder forwards (NFE) must be
equal, not close. Models and both sides: tests/diffusion_gemma_support.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from diffusion_gemma_support import (
    FULL,
    PAD,
    SLIDING,
    assert_same,
    batch_forwards,
    canvas_of_first_end,
    eb,
    network,
    reference,
    run,
    tiny_model,
)

from mdmkit.samplers import RevisableSampler, ThresholdSampler, TopKSampler

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


CASES = {  # name: (model settings, prompts, new tokens, steps, bound, stability, confidence, t_min, t_max)
    "dense-sliding-full-c8-stable1": ({}, [[5, 6, 7, 8], [9, 10]], 24, 6, 0.1, 1, 10.0, 0.4, 0.8),
    "dense-c8-stable0-wide-bound": ({}, [[5, 6, 7, 8], [9, 10]], 24, 6, 2.0, 0, 10.0, 0.4, 0.8),
    "moe-c16-stable1-three-rows": ({"moe": True, "canvas": 16}, [[5, 6, 7, 8], [9, 10], [11]], 32, 5, 5.0, 1,
                                   10.0, 0.4, 0.8),
    "moe-full-only-c32-never-confident": ({"moe": True, "canvas": 32, "layers": (FULL,)}, [[3, 4, 5], [6]], 32, 4,
                                          0.5, 1, 0.005, 0.4, 0.8),
    "dense-three-layers-c16-hot": ({"canvas": 16, "layers": (SLIDING, SLIDING, FULL)}, [[7, 8, 9, 10, 11], [12]],
                                   48, 3, 1.0, 2, 10.0, 1.0, 2.0),
    "dense-c8-cold-schedule": ({}, [[5, 6, 7]], 16, 8, 0.3, 1, 10.0, 0.0, 0.3),
    # sharp logits and a wide bound: the argmax canvas settles, so the stop acts on stability as well
    "moe-sharp-c16-stable2": ({"moe": True, "canvas": 16, "vocab": 16, "seed": 2, "sharpen": 24.0},
                              [[5, 6, 7, 8], [9, 10]], 48, 8, 50.0, 2, 2.0, 0.1, 0.3),
    "dense-sharp-c8-stable1": ({"vocab": 16, "seed": 1, "sharpen": 24.0}, [[5, 6, 7, 8], [9, 10]], 24, 8, 5.0, 1,
                               2.0, 0.1, 0.3),
    "dense-sharp-c8-stable2-ends": ({"vocab": 16, "seed": 0, "sharpen": 12.0}, [[5, 6, 7, 8], [9, 10]], 24, 8,
                                    50.0, 2, 2.0, 0.1, 0.3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_eb_matches_transformers_generate(name: str) -> None:
    settings, prompts, new, steps, bound, stability, confidence, t_min, t_max = CASES[name]
    model = tiny_model(**settings)
    ref = reference(model, prompts, new, steps=steps, bound=bound, stability=stability, confidence=confidence,
                    t_min=t_min, t_max=t_max)
    sampled, counter, start = run(network(model), prompts, new,
                                  eb(bound, steps, stability, confidence, t_min=t_min, t_max=t_max))
    assert_same(ref, sampled, counter, start)
    # one encoder pass per canvas a row needed: the prompt, then each finished canvas before its last
    assert bool((counter.extra["encoder"] >= 1).all())


@pytest.mark.parametrize(("vocab", "seed"), [(12, 5), (16, 3), (12, 1)])
def test_rows_ending_in_different_canvases(vocab: int, seed: int) -> None:
    """Rows of different prompt lengths end in different canvases (or never): the rows ended before a canvas are all
    padding in it, a row's tokens after its end too, and its forwards stop being counted."""
    model, prompts = tiny_model(vocab=vocab, seed=seed), [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5]]
    ref = reference(model, prompts, 32, steps=4, bound=1.0, stability=1, confidence=10.0)
    sampled, counter, start = run(network(model), prompts, 32, eb(1.0, 4, 1, 10.0))
    assert len(set(canvas_of_first_end(ref.sequences, start, 8))) >= 2  # the scenario these cases are for
    assert_same(ref, sampled, counter, start)


def test_bfloat16_matches() -> None:
    """In bfloat16 the self-conditioning logits are cast to the embeddings' dtype, as the reference casts them."""
    model, prompts = tiny_model(moe=True, dtype=torch.bfloat16), [[5, 6, 7, 8], [9, 10]]
    ref = reference(model, prompts, 16, steps=4, bound=0.5, stability=1, confidence=10.0)
    sampled, counter, start = run(network(model), prompts, 16, eb(0.5, 4, 1, 10.0))
    assert_same(ref, sampled, counter, start)


def test_without_the_adaptive_stop() -> None:
    """`stability_threshold: null` turns the stop off. The reference cannot say so (its generation config fills the
    defaults 1 and 0.005 back in), so it is compared where its stop cannot act: a random model's mean entropy stays
    far above 0.005. Every row then runs every step of every canvas it is still writing."""
    model, prompts = tiny_model(canvas=16), [[5, 6, 7, 8], [9, 10]]
    ref = reference(model, prompts, 32, steps=5, bound=0.2, stability=1, confidence=0.005)
    sampled, counter, start = run(network(model), prompts, 32, eb(0.2, 5, None, None))
    assert_same(ref, sampled, counter, start)
    ends = canvas_of_first_end(sampled.tokens, start, 16)
    assert counter.nfe.tolist() == [5 * (2 if end is None else end + 1) for end in ends]


def test_lockstep_is_what_makes_batches_exact() -> None:
    """Why `lockstep: false` cannot equal the reference: the reference keeps a canvas's steps going until every row
    has stopped it, rows that ended their text included, and every step draws for the whole batch. Leaving those
    steps out saves batch forwards but moves the random stream, so the later canvases of the other rows change. A row
    alone in its batch has nobody to wait for: there both agree."""
    model, prompts = tiny_model(vocab=12, seed=3, sharpen=6.0), [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5]]
    net, exact_sampler = network(model), eb(1.0, 6, 0, 1.5)
    ref = reference(model, prompts, 32, steps=6, bound=1.0, stability=0, confidence=1.5)
    assert_same(ref, *run(net, prompts, 32, exact_sampler))
    waiting, exact = batch_forwards(net, prompts, 32, exact_sampler)
    saving, other = batch_forwards(net, prompts, 32, dataclasses.replace(exact_sampler, lockstep=False))
    assert saving < waiting and not torch.equal(exact, other)
    first_end = min(end for end in canvas_of_first_end(exact, 5, 8) if end is not None)
    settled_alike = 5 + 8 * (first_end + 1)  # up to the canvas where the first row ended, nothing differs yet
    assert torch.equal(exact[:, :settled_alike], other[:, :settled_alike])
    single = [[10, 11]]
    ref = reference(model, single, 32, steps=6, bound=1.0, stability=0, confidence=1.5)
    assert_same(ref, *run(net, single, 32, dataclasses.replace(exact_sampler, lockstep=False)))


def test_a_row_draws_with_its_batch() -> None:
    """Each step draws for every position of the batch, so a prompt's tokens depend on the batch it is in (the
    reference's do too): mdmkit reproduces the batched and the single-row reference, which differ."""
    model, prompts = tiny_model(), [[5, 6, 7, 8], [9, 10]]
    net, sampler = network(model), eb(0.5, 4, 1, 10.0)
    batched = reference(model, prompts, 16, steps=4, bound=0.5, stability=1, confidence=10.0)
    alone = reference(model, prompts[1:], 16, steps=4, bound=0.5, stability=1, confidence=10.0)
    assert not torch.equal(batched.sequences[1, 4:], alone.sequences[0, 2:])
    assert_same(batched, *run(net, prompts, 16, sampler))
    assert_same(alone, *run(net, prompts[1:], 16, sampler))


def test_an_answer_shorter_than_its_canvases() -> None:
    """An answer that does not fill its last canvas takes that canvas's first tokens: the same draws as the
    reference, which returns whole canvases (its `tokens_per_forward` counts them all)."""
    model, prompts = tiny_model(), [[5, 6, 7, 8], [9, 10]]
    ref = reference(model, prompts, 20, steps=4, bound=0.5, stability=1, confidence=10.0)
    sampled, counter, start = run(network(model), prompts, 20, eb(0.5, 4, 1, 10.0))
    assert ref.sequences.shape[1] == start + 24 and sampled.tokens.shape[1] == start + 20
    assert torch.equal(sampled.tokens, ref.sequences[:, : start + 20])
    assert torch.equal(torch.round((ref.sequences[:, start:] != PAD).sum(-1) / ref.tokens_per_forward).long(),
                       counter.nfe)


def restated(keep_rule):
    """A reference sampler that accepts by `keep_rule(probability of each drawn token) -> bool [B, L]` instead of
    the entropy bound, renoising as the reference does (its `EntropyBoundSampler`, acceptance replaced)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSampler

    class Restated(EntropyBoundSampler):
        def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            self.accepted_token_mask = keep_rule(probs.gather(-1, denoiser_canvas[..., None]).squeeze(-1))
            return torch.where(self.accepted_token_mask, denoiser_canvas, current_canvas)

    return Restated


def threshold_keep(tau: float):
    def keep(drawn_prob: torch.Tensor) -> torch.Tensor:
        best = torch.zeros_like(drawn_prob, dtype=torch.bool).scatter(1, drawn_prob.argmax(1, keepdim=True), True)
        return (drawn_prob >= tau) | best
    return keep


def topk_keep(k: int):
    def keep(drawn_prob: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(drawn_prob, dtype=torch.bool).scatter(1, drawn_prob.topk(k, dim=1).indices, True)
    return keep


@pytest.mark.parametrize(("rule", "keep"), [(ThresholdSampler(tau=0.3), threshold_keep(0.3)),
                                            (TopKSampler(k=3), topk_keep(3))], ids=["threshold", "topk"])
def test_another_rule_is_the_reference_loop_with_its_acceptance(rule, keep, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule other than EB runs the reference's very loop: `generate` with its acceptance restated in place of the
    entropy bound gives the same tokens and NFE."""
    model, prompts = tiny_model(moe=True, vocab=16, sharpen=6.0), [[5, 6, 7, 8], [9, 10]]
    sampler_class = restated(keep)
    monkeypatch.setattr(type(model), "_prepare_sampler", lambda self, config: sampler_class(
        config.sampler_config, self.config.canvas_length, self.config.text_config.vocab_size,
        config.max_denoising_steps))
    ref = reference(model, prompts, 24, steps=5, bound=0.1, stability=1, confidence=1.5)
    sampler = RevisableSampler(rule=rule, max_steps=5, stability_threshold=1, confidence_threshold=1.5)
    assert_same(ref, *run(network(model), prompts, 24, sampler))


def test_stopped_rows_leave_the_forwards() -> None:
    """A row that has stopped its canvas is not run again in it (its logits never depended on the other rows, and
    the draws are still made for the whole batch): the tokens stay the reference's."""
    model, prompts = tiny_model(moe=True, canvas=16, vocab=16, seed=2, sharpen=24.0), [[5, 6, 7, 8], [9, 10]]
    net, widths = network(model), []
    decode = net.decode
    net.decode = lambda state, canvas, *rest: widths.append(canvas.shape[0]) or decode(state, canvas, *rest)
    ref = reference(model, prompts, 48, steps=8, bound=50.0, stability=2, confidence=2.0, t_min=0.1, t_max=0.3)
    sampled, counter, start = run(net, prompts, 48, eb(50.0, 8, 2, 2.0, t_min=0.1, t_max=0.3))
    assert_same(ref, sampled, counter, start)
    assert 1 in widths and sum(widths) < 2 * len(widths)

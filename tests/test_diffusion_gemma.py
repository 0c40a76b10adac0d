"""DiffusionGemma (`hf.kind=diffusion_gemma`) and revisable decoding (`RevisableSampler`), token for token against
transformers' own `DiffusionGemmaForBlockDiffusion.generate`.

Tiny random models are built here from transformers' config classes. A DiffusionGemma layer always holds a dense MLP
beside its routed experts, so "dense" is one expert that every token takes, "MoE" four experts of which each token
takes two. Both sides draw from generators seeded alike (the reference from torch's global one): canvas noise,
multinomial draws and renoising come in the same order and shapes, so tokens, `tokens_per_forward` and each row's
decoder forwards (NFE) must be equal, not close. Random weights leave the mean entropy near log(V): the stop's
confidence threshold is set above that where a case wants the adaptive stop to act (on argmax stability alone).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from mdmkit.core.errors import CapabilityError, CheckpointError, ConfigError
from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import CANVAS
from mdmkit.models.llm.kinds.diffusion_gemma import DiffusionGemmaNetwork, wrap
from mdmkit.samplers import (
    EBSampler,
    ForwardCounter,
    KlassSampler,
    RevealAllSampler,
    RevisableSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.core.canvas import Draw, tokens_per_forward
from mdmkit.samplers.rules.revisable import acceptance

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
PAD, EOS = 0, 1
FULL, SLIDING = "full_attention", "sliding_attention"


def tiny_model(*, moe: bool = False, canvas: int = 8, layers: tuple[str, ...] = (SLIDING, FULL), vocab: int = 64,
               seed: int = 0, dtype: torch.dtype = torch.float32, sharpen: float = 1.0) -> torch.nn.Module:
    """`sharpen` scales the (tied) output layer: logits sharp enough that rows stop canvases at different steps."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig

    text = DiffusionGemmaTextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layers), num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=16, sliding_window=4, layer_types=list(layers),
        max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
        num_experts=4 if moe else 1, top_k_experts=2 if moe else 1, moe_intermediate_size=16)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=text.to_dict(), canvas_length=canvas))
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model.to(dtype).eval()


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        keep[row, width - len(prompt):] = True
    return ids, keep


def reference(model, prompts, new: int, *, steps: int, bound: float, stability: int, confidence: float,
              t_min: float = 0.4, t_max: float = 0.8, seed: int = 1):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    ids, keep = left_padded(prompts)
    torch.manual_seed(seed)
    return model.generate(ids, attention_mask=keep.long(), max_new_tokens=new, max_denoising_steps=steps,
                          sampler_config=EntropyBoundSamplerConfig(entropy_bound=bound), stability_threshold=stability,
                          confidence_threshold=confidence, t_min=t_min, t_max=t_max, eos_token_id=EOS,
                          pad_token_id=PAD)


def network(model) -> DiffusionGemmaNetwork:
    """The model as mdmkit's network, ending and padding texts as the reference runs are told to."""
    net = wrap(model)
    net._spec = dataclasses.replace(net.canvas, eos_ids=(EOS,), pad_id=PAD)
    return net


def run(net: DiffusionGemmaNetwork, prompts, new: int, sampler: RevisableSampler, seed: int = 1):
    """mdmkit's fill of `new` answer positions: its tokens, counter and answer start."""
    ids, keep = left_padded(prompts)
    rows = len(prompts)
    canvas = torch.cat([ids, torch.full((rows, new), net.mask_id)], 1)
    attention = torch.cat([keep, torch.ones(rows, new, dtype=torch.bool)], 1)
    counter = ForwardCounter(net, rows)
    sampled = sampler.sample(counter, canvas, net.mask_id, torch.Generator().manual_seed(seed),
                             attention_mask=attention)
    return sampled, counter, ids.shape[1]


def eb(bound: float, steps: int, stability: int | None, confidence: float | None, **schedule) -> RevisableSampler:
    return RevisableSampler(rule=EBSampler(gamma=bound, ordering="entropy"), max_steps=steps,
                            stability_threshold=stability, confidence_threshold=confidence, **schedule)


def assert_same(ref, sampled, counter, start: int) -> None:
    """Equal tokens (the reference stops at the canvas where every row has ended: the rest is padding), equal
    tokens per forward, and NFE from them (the reference counts no forwards of its own)."""
    length = ref.sequences.shape[1]
    assert torch.equal(sampled.tokens[:, :length], ref.sequences)
    assert bool((sampled.tokens[:, length:] == PAD).all())
    assert torch.equal(tokens_per_forward(sampled, start, counter.nfe, PAD), ref.tokens_per_forward)
    valid = (ref.sequences[:, start:] != PAD).sum(-1)
    assert torch.equal(torch.round(valid / ref.tokens_per_forward).long(), counter.nfe)
    assert torch.equal(sampled.steps, counter.nfe)


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


def canvas_of_first_end(tokens: torch.Tensor, start: int, canvas: int) -> list[int | None]:
    ends = []
    for row in tokens[:, start:]:
        at = (row == EOS).nonzero()
        ends.append(int(at[0]) // canvas if at.numel() else None)
    return ends


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


def batch_forwards(net: DiffusionGemmaNetwork, prompts, new: int,
                   sampler: RevisableSampler) -> tuple[int, torch.Tensor]:
    """How many batch forwards a fill ran (stopped rows ride along in them), and its tokens."""
    ids, keep = left_padded(prompts)
    canvas = torch.cat([ids, torch.full((len(prompts), new), net.mask_id)], 1)
    attention = torch.cat([keep, torch.ones(len(prompts), new, dtype=torch.bool)], 1)
    ticks = []
    counter = ForwardCounter(net, len(prompts), on_forward=lambda: ticks.append(1))
    sampled = sampler.sample(counter, canvas, net.mask_id, torch.Generator().manual_seed(1), attention_mask=attention)
    return len(ticks), sampled.tokens


def test_lockstep_is_what_makes_batches_exact() -> None:
    """Why `lockstep: false` cannot equal the reference: the reference keeps a canvas's steps going until every row
    has stopped it, rows that ended their text included, and every step draws for the whole batch. Leaving those
    steps out saves batch forwards but moves the random stream, so the later canvases of the other rows change. A row
    alone in its batch has nobody to wait for: there both agree."""
    model, prompts = tiny_model(vocab=12, seed=0, sharpen=6.0), [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5]]
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


def a_draw(rows: int = 3, width: int = 16, vocab: int = 20, seed: int = 0, step: int = 0) -> Draw:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, vocab, generator=generator) * torch.rand(rows, width, 1, generator=generator) * 6
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    drawn = torch.multinomial(probs.view(-1, vocab), 1, generator=generator).view(rows, width)
    current = torch.randint(0, vocab, (rows, width), generator=generator)
    return Draw(logits, probs, drawn, current, step, 8)


@pytest.mark.parametrize("bound", [0.01, 0.1, 1.0, 5.0, 100.0])
def test_eb_accepts_the_reference_positions(bound: float) -> None:
    """EB on the canvas keeps exactly the positions transformers' `EntropyBoundSampler.accept_canvas` keeps."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSampler,
        EntropyBoundSamplerConfig,
    )

    for seed in range(4):
        draw = a_draw(seed=seed)
        theirs = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=bound), 16, 20, 8)
        kept = theirs.accept_canvas(draw.current, draw.drawn, draw.logits, 8)
        mine = acceptance(EBSampler(gamma=bound, ordering="entropy"))(draw)
        assert torch.equal(mine, theirs.accepted_token_mask)
        assert torch.equal(torch.where(mine, draw.drawn, draw.current), kept)


def test_what_the_other_rules_keep() -> None:
    """Threshold keeps every drawn token at or above tau (at least the most probable one), top-k k per row, steps
    L // steps per step and everything from its last step, reveal_all the whole draw."""
    draw = a_draw(seed=1)
    kept = acceptance(ThresholdSampler(tau=0.5))(draw)
    above = draw.drawn_prob >= 0.5
    best = torch.zeros_like(above).scatter(1, draw.drawn_prob.argmax(1, keepdim=True), True)
    assert torch.equal(kept, above | best)
    assert acceptance(TopKSampler(k=3, ordering="margin"))(draw).sum(1).tolist() == [3, 3, 3]
    assert acceptance(StepsSampler(steps=4))(draw).sum(1).tolist() == [4, 4, 4]
    assert bool(acceptance(StepsSampler(steps=4))(a_draw(seed=1, step=3)).all())
    assert bool(acceptance(RevealAllSampler())(draw).all())


def test_other_rules_run_on_the_canvas() -> None:
    """Any ordering x budget rule decodes: top-k with k = the canvas keeps the whole draw each step, so with the stop
    at stability 0 (and confidence above any entropy) every canvas takes one forward."""
    model = tiny_model()
    net, prompts = network(model), [[5, 6, 7, 8], [9, 10]]
    sampler = RevisableSampler(rule=TopKSampler(k=8), max_steps=6, stability_threshold=0, confidence_threshold=10.0)
    sampled, counter, start = run(net, prompts, 24, sampler)
    ends = canvas_of_first_end(sampled.tokens, start, 8)
    assert counter.nfe.tolist() == [3 if end is None else end + 1 for end in ends]
    threshold = RevisableSampler(rule=ThresholdSampler(tau=0.2, ordering="confidence"), max_steps=4)
    sampled, counter, start = run(net, prompts, 16, threshold)
    assert bool(((sampled.tokens[:, start:] >= 0) & (sampled.tokens[:, start:] < 64)).all())
    assert bool((counter.nfe <= 8).all()) and bool((counter.nfe >= 1).all())


@pytest.mark.parametrize(("rule", "words"), [
    (KlassSampler(), "memory of masked positions"),
    (EBSampler(ordering="random"), "random stream"),
    (EBSampler(temperature=0.5), "schedule's"),
    (EBSampler(block_length=8), "the canvas is the block"),
    (EBSampler(mask_in_softmax=True), "no mask token"),
])
def test_rules_that_mean_nothing_here_are_refused(rule, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as refused:
        RevisableSampler(rule=rule)
    assert "\n" not in str(refused.value)


def test_bad_settings_are_refused_in_one_line() -> None:
    for settings, words in [({"max_steps": 0}, "max_steps"), ({"t_min": None}, "set together"),
                            ({"t_min": 0.9, "t_max": 0.5}, "t_min <= t_max"),
                            ({"confidence_threshold": 0.0}, "confidence_threshold")]:
        with pytest.raises(ConfigError, match=words):
            RevisableSampler(**settings)
    net = network(tiny_model())
    with pytest.raises(CapabilityError, match="sampler=diffusion_gemma"):  # a masked sampler on the canvas network
        EBSampler().sample(ForwardCounter(net, 1), torch.tensor([[5, net.mask_id]]), net.mask_id)
    with pytest.raises(CapabilityError, match="hf.kind=diffusion_gemma"):  # the canvas loop on a masked network
        RevisableSampler().sample(ForwardCounter(lambda tokens, attn_mask=None: tokens, 1), torch.tensor([[5, 0]]), 0)
    with pytest.raises(CapabilityError, match="text only"):
        net.open(torch.tensor([[5, int(net.model.config.image_token_id)]]), None)
    with pytest.raises(ConfigError, match="at least one token"):
        RevisableSampler().sample(ForwardCounter(net, 1), torch.tensor([[net.mask_id, net.mask_id]]), net.mask_id)
    with pytest.raises(ConfigError, match="last columns"):
        RevisableSampler().sample(ForwardCounter(net, 1), torch.tensor([[net.mask_id, 5, net.mask_id]]), net.mask_id)


CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<model>"


def saved_model(directory: Path) -> Path:
    """A tiny DiffusionGemma on a byte-level tokenizer with a chat template, saved as a hub directory."""
    from tiny_text_models import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = CHAT
    model = tiny_model(vocab=len(tokenizer))
    model.config.text_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_the_kind_loads_a_directory_through_transformers(tmp_path: Path) -> None:
    from mdmkit.models.llm.registry import declared_kind, load_model, model_kind

    directory = saved_model(tmp_path / "dg")
    raw = json.loads((directory / "config.json").read_text())
    assert declared_kind(raw) is model_kind("diffusion_gemma")
    net, tokenizer = load_model(str(directory), "diffusion_gemma")
    assert isinstance(net, DiffusionGemmaNetwork) and CANVAS in net.capabilities
    assert net.canvas == CanvasSpec(8, len(tokenizer), (tokenizer.eos_token_id,), tokenizer.pad_token_id)
    assert net.mask_id == len(tokenizer)  # past the vocabulary: never fed, never drawn
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 3?"}], tokenize=False)
    assert prompt == "<user>2 + 3?\n<model>"
    half, _ = load_model(str(directory), "diffusion_gemma", dtype="bfloat16")
    assert next(half.parameters()).dtype == torch.bfloat16
    prompts = [tokenizer.encode("Answer:")]
    for network_ in (net, half):
        sampled, counter, start = run(network_, prompts, 16, RevisableSampler(max_steps=3))
        assert bool((sampled.tokens[:, start:] < len(tokenizer)).all()) and int(counter.nfe[0]) >= 1
    with pytest.raises(CheckpointError, match="float32 or bfloat16"):
        load_model(str(directory), "diffusion_gemma", dtype="float16")
    with pytest.raises(CheckpointError, match="no model directory"):
        load_model(str(tmp_path / "missing"), "diffusion_gemma")


def test_the_preset_is_transformers_defaults() -> None:
    """`sampler=diffusion_gemma` is the dataclass's defaults, which are `generate`'s."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    from mdmkit.core.config import build, option

    built = build(option("sampler", "diffusion_gemma"), "sampler")
    assert built == RevisableSampler()
    defaults = DiffusionGemmaGenerationConfig._get_default_generation_params()
    assert (built.max_steps, built.t_min, built.t_max) == (defaults["max_denoising_steps"], defaults["t_min"],
                                                            defaults["t_max"])
    assert (built.stability_threshold, built.confidence_threshold) == (defaults["stability_threshold"],
                                                                        defaults["confidence_threshold"])
    assert built.rule == EBSampler(gamma=defaults["sampler_config"].entropy_bound, ordering="entropy")


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


def test_a_stop_condition_notes_the_nfe_and_ends_the_row() -> None:
    """generate_until: a row whose settled text holds a stop sequence has its NFE noted there; with `lockstep: false`
    it also writes no further canvas (padding), while lockstep keeps the reference's steps and only notes it."""
    from mdmkit.core.stopping import StopCondition

    model, prompts = tiny_model(), [[5, 6, 7, 8], [9, 10]]
    net = network(model)
    free, counter, start = run(net, prompts, 24, eb(0.5, 3, None, None, lockstep=False))
    stop_token = int(free.tokens[0, start + 3])  # a token row 0 writes in its first canvas
    ids, keep = left_padded(prompts)
    canvas = torch.cat([ids, torch.full((2, 24), net.mask_id)], 1)
    attention = torch.cat([keep, torch.ones(2, 24, dtype=torch.bool)], 1)
    for lockstep in (True, False):
        counter = ForwardCounter(net, 2)
        sampled = eb(0.5, 3, None, None, lockstep=lockstep).sample(
            counter, canvas, net.mask_id, torch.Generator().manual_seed(1), attention_mask=attention,
            stop=StopCondition.of([stop_token]))
        assert int(counter.nfe_at_stop[0]) == 3  # met in the first canvas
        assert torch.equal(sampled.tokens[0, : start + 8], free.tokens[0, : start + 8])
        if not lockstep:
            assert int(counter.nfe[0]) == 3 and bool((sampled.tokens[0, start + 8:] == PAD).all())


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

"""Revisable decoding's parts: what each acceptance rule keeps (EB against the reference's own), rules that mean
nothing on a revisable canvas refused in one line, the `diffusion_gemma` kind loading a saved directory, the preset,
and stop conditions. Models: tests/diffusion_gemma_support.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusion_gemma_support import (
    PAD,
    assert_same,
    canvas_of_first_end,
    eb,
    left_padded,
    network,
    run,
    saved_model,
    tiny_model,
)

from mdmkit.core.errors import CapabilityError, CheckpointError, ConfigError
from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import CANVAS
from mdmkit.models.llm.kinds.diffusion_gemma import DiffusionGemmaNetwork
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
from mdmkit.samplers.core.canvas import Draw
from mdmkit.samplers.rules.revisable import acceptance

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_a_checkpoint_s_own_generate_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint's generation_config.json may set other values than transformers' defaults (the preset's): the
    kind's default sampler read from its directory (`api.kind_sampler(..., ckpt=)`, evaluate.py's and lm-eval's path)
    takes them, so it is that checkpoint's `generate` again, tokens and NFE; a field given wins over the checkpoint."""
    from tiny_text_models import byte_level_tokenizer
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    from mdmkit import api
    from mdmkit.core.config import option
    from mdmkit.models.llm.registry import load_model

    model = tiny_model(vocab=16, sharpen=6.0)
    settings = {"max_denoising_steps": 5, "t_min": 0.2, "t_max": 0.9, "stability_threshold": 0,
                "confidence_threshold": 1.5}
    model.generation_config.update(**settings, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.7),
                                   eos_token_id=1, pad_token_id=0)
    model.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="holds its tokenizer"):
        load_model(str(tmp_path), "diffusion_gemma")
    byte_level_tokenizer().save_pretrained(tmp_path)
    sampler = api.kind_sampler("diffusion_gemma", ckpt=str(tmp_path))
    assert sampler == RevisableSampler(rule=EBSampler(gamma=0.7, ordering="entropy"), max_steps=5, t_min=0.2,
                                       t_max=0.9, stability_threshold=0, confidence_threshold=1.5)
    assert capsys.readouterr().out == (f"[mdmkit] sampler=diffusion_gemma (diffusion_gemma's default) with the "
                                       f"settings {tmp_path} gives itself: max_steps=5, t_min=0.2, t_max=0.9, "
                                       "stability_threshold=0, confidence_threshold=1.5, rule.gamma=0.7\n")
    net, _ = load_model(str(tmp_path), "diffusion_gemma")
    prompts = [[5, 6, 7, 8], [9, 10]]
    ids, keep = left_padded(prompts)
    torch.manual_seed(1)
    ref = net.model.generate(ids, attention_mask=keep.long(), max_new_tokens=16)  # the checkpoint's own settings
    assert_same(ref, *run(net, prompts, 16, sampler))
    threshold = option("sampler", "threshold")
    given = api.kind_sampler("diffusion_gemma", ckpt=str(tmp_path), max_steps=3, rule=threshold)
    assert (given.max_steps, given.t_min, given.rule) == (3, 0.2, ThresholdSampler())  # rule given: no gamma
    assert capsys.readouterr().out.endswith("; yours win over its max_steps=5, rule.gamma=0.7\n")

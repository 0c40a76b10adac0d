"""Tiny DiffusionGemma models built from transformers' own config classes, and the two sides of a comparison:
transformers' `generate` (`reference`) and mdmkit's canvas loop (`run`), for tests/test_diffusion_gemma.py and
tests/test_revisable.py.

A DiffusionGemma layer always holds a dense MLP beside its routed experts, so "dense" is one expert that every token
takes, "MoE" four experts of which each token takes two. Both sides draw from generators seeded alike (the reference
from torch's global one). Random weights leave the mean entropy near log(V): `sharpen` scales the tied output layer
so that rows settle and stop at different steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from mdmkit.models.llm.kinds.diffusion_gemma import DiffusionGemmaNetwork, wrap
from mdmkit.samplers import EBSampler, ForwardCounter, RevisableSampler
from mdmkit.samplers.core.canvas import tokens_per_forward

PAD, EOS = 0, 1
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' default vision tower alone is 167M parameters: text only runs here, so a token one
TINY_VISION = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "position_embedding_size": 64}


def tiny_model(*, moe: bool = False, canvas: int = 8, layers: tuple[str, ...] = (SLIDING, FULL), vocab: int = 64,
               seed: int = 0, dtype: torch.dtype = torch.float32, sharpen: float = 1.0) -> torch.nn.Module:
    """`sharpen` scales the (tied) output layer: logits sharp enough that rows stop canvases at different steps."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig

    text = DiffusionGemmaTextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layers), num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=4, layer_types=list(layers),
        max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
        num_experts=4 if moe else 1, top_k_experts=2 if moe else 1, moe_intermediate_size=16)
    torch.manual_seed(seed)
    config = DiffusionGemmaConfig(text_config=text.to_dict(), vision_config=TINY_VISION, canvas_length=canvas)
    model = DiffusionGemmaForBlockDiffusion(config)
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


def canvas_of_first_end(tokens: torch.Tensor, start: int, canvas: int) -> list[int | None]:
    ends = []
    for row in tokens[:, start:]:
        at = (row == EOS).nonzero()
        ends.append(int(at[0]) // canvas if at.numel() else None)
    return ends


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

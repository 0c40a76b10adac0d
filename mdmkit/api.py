"""mdmkit from Python: a sampler from a preset, a model from its directory, and generation with NFE counted.

    from mdmkit import api

    sampler = api.sampler("fastdllm_threshold", cache="dual", tau=0.9)     # conf/sampler/<preset>.yaml + fields
    default = api.kind_sampler("diffusion_gemma", ckpt="/models/dg")       # the kind's own, when none is named
    model = api.load_text_model("GSAI-ML/LLaDA-8B-Instruct", kind="llada", dtype="bfloat16", device="cuda")
    made = api.generate(model, ["Question: ..."], sampler, gen_length=256)  # .texts, .nfe, .nfe_to_stop
    filled = api.fill(model.network, [[12, 7, 99]], sampler, gen_length=32, mask_id=model.network.mask_id)

`fill` works on token ids and any mdmkit network (a puzzle model, a native LLaDA / Dream); `generate` on text,
with the same stops, prompt cutting and counting as `evaluate.py task=gsm8k` and `mdmkit-lm-eval`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mdmkit.core.config import option, require
from mdmkit.core.seeding import seeded_generator
from mdmkit.core.stopping import Stop
from mdmkit.evaluation.generation import Generations, TextModel, masked_canvas
from mdmkit.evaluation.generation import generate as run_generation
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.evaluation.plan import checkpoint_sampler_fields, with_fields
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.text_eval import load_text_model as _load_text_model
from mdmkit.models.llm.registry import model_kind
from mdmkit.samplers import ForwardCounter, Sampler

__all__ = ["Filled", "Generations", "TextModel", "fill", "generate", "kind_sampler", "load_text_model", "sampler"]


def sampler(preset: str, network: torch.nn.Module | None = None, **fields: Any) -> Sampler:
    """The sampler of option `preset` (`conf/sampler/<preset>.yaml`, as `sampler=<preset>` composes it) with
    `fields` set on top, validated. With `network`, checkpoints the config names (P2's planner, NI's indicator)
    are loaded for it and its capabilities are checked."""
    return _built(preset, option("sampler", preset), network, fields)


def kind_sampler(kind: str, network: torch.nn.Module | None = None, *, ckpt: str | None = None,
                 **fields: Any) -> Sampler:
    """The sampler a model of `kind` generates with when none is named (its record's `default_sampler`, as
    evaluate.py and mdmkit-lm-eval take it: `diffusion_gemma` for DiffusionGemma, `ntp` for a causal LM, else
    `eb`), with `fields` set on top. `ckpt`: the model directory or hub name, whose own settings (its kind's
    `sampler_settings`, read without its weights) it then follows under `fields`, as they do, in one printed line."""
    record = model_kind(kind)
    own: dict[str, Any]
    preset, own = record.default_sampler, {}
    if ckpt is not None:
        own, note = checkpoint_sampler_fields(record, ckpt, given=fields)
        if note:
            print(note)
    return _built(preset, with_fields(option("sampler", preset), own, preset), network, fields)


def _built(preset: str, config: dict[str, Any], network: torch.nn.Module | None, fields: dict[str, Any]) -> Sampler:
    unknown = sorted(set(fields) - set(config))
    require(not unknown, f"sampler {preset}: unknown field(s) {unknown} (valid: "
                         f"{', '.join(sorted(k for k in config if k != '_target_'))})")
    return build_sampler({**config, **fields}, network)


def load_text_model(name_or_path: str, kind: str = "generic", *,
                    dtype: Literal["float32", "float16", "bfloat16"] = "float32", device: str = "cpu",
                    max_length: int | None = None, trust_remote_code: bool = False,
                    adapter: str | None = None, adapter_any_base: bool = False) -> TextModel:
    """A Hugging Face model directory or hub name with its tokenizer (`kind`: a registered model kind,
    `mdmkit.models.llm.registry.kind_names()`), as `evaluate.py ckpt=... hf.kind=...` loads it; `adapter`: a LoRA
    adapter directory merged into its weights (one mdmkit saved is refused on other weights than its base's unless
    `adapter_any_base`)."""
    config = HFModelConfig(kind=kind, dtype=dtype, max_length=max_length, trust_remote_code=trust_remote_code,
                           adapter=adapter, adapter_any_base=adapter_any_base)
    return _load_text_model(name_or_path, config, device)


@dataclass
class Filled:
    """`fill`'s result: each row's prompt and answer, and its forward passes (to the end, and to the stop)."""

    tokens: torch.Tensor  # [B, P + gen_length], prompts left-padded with `pad_id`
    nfe: torch.Tensor  # [B]
    nfe_to_stop: torch.Tensor  # [B]


@torch.no_grad()
def fill(network: torch.nn.Module, prompts: list[list[int]], sampler: Sampler, gen_length: int, mask_id: int, *,
         seed: int | Sequence[int] = 0, pad_id: int = 0, stop: Stop | None = None) -> Filled:
    """`gen_length` masked positions after each prompt (token ids, left-padded in one batch), filled by `sampler`
    through a forward counter; random draws from `seed`, or, given a seed per row, each row's from its own (a rule
    that draws per row, SDAR's, then gives every row what it gives alone with its seed; the others draw from the
    first seed's stream)."""
    require(gen_length >= 1, f"gen_length={gen_length} must be >= 1")
    require(len(prompts) > 0, "fill needs at least one prompt")
    device = next(network.parameters()).device
    canvas, attention, _ = masked_canvas([list(p) for p in prompts], gen_length, mask_id, pad_id, device)
    seeds = [seed] if isinstance(seed, int) else list(seed)
    require(isinstance(seed, int) or len(seeds) == len(prompts),
            f"{len(seeds)} seeds for {len(prompts)} prompts: one seed, or one per prompt")
    rows = None if isinstance(seed, int) else tuple(seeded_generator(s, device) for s in seeds)
    counter = ForwardCounter(network, len(prompts))
    was_training = network.training
    network.eval()
    try:
        sampled = sampler.sample(counter, canvas, mask_id, seeded_generator(seeds[0], device),
                                 attention_mask=attention, stop=stop, row_generators=rows)
    finally:
        network.train(was_training)
    return Filled(sampled.tokens, counter.nfe, counter.nfe_to_stop)


def generate(model: TextModel, prompts: list[str], sampler: Sampler, gen_length: int, stops: list[str] | None = None,
             *, batch_size: int = 8, seed: int = 0, chat: bool = False, progress: bool = True) -> Generations:
    """Up to `gen_length` answer tokens per prompt (text in, text out): a row stops at the end-of-text token or a
    stop phrase; `Generations` holds the texts scored, the raw answers, NFE to the end and to the stop."""
    made = run_generation(model, prompts, sampler, gen_length, list(stops or []), batch_size=batch_size, seed=seed,
                          chat=chat, progress=progress)
    assert made is not None  # one process: it holds every answer
    return made

"""DiffusionGemma (google/diffusiongemma-*): block diffusion over revisable canvases, run by transformers' own
`DiffusionGemmaForBlockDiffusion` (no remote code), text only.

A causal encoder reads the prompt and each finished canvas into a KV cache; a bidirectional decoder denoises the next
canvas over it, fed the previous step's logits. The network here exposes exactly those two passes (capability
`canvas`, models/canvas.py) and makes them the way transformers' `generate` does (the same masks, positions and
cache), so that the canvas loop (`sampler=diffusion_gemma`) reproduces that `generate` token for token.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mdmkit.core.errors import CapabilityError, CheckpointError
from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import CANVAS, AttentionKind
from mdmkit.models.llm.hf import check_model_source
from mdmkit.models.llm.registry import ExampleModel, ModelKind, register_kind

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the precisions its published weights run in
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
GENERATION_CONFIG = "generation_config.json"
# the generation_config.json settings of its `generate` as the fields of sampler=diffusion_gemma: (field, its type,
# the least value, whether it must exceed it), as transformers' DiffusionGemmaGenerationConfig checks them
_SETTINGS: dict[str, tuple[str, type | tuple[type, ...], float, bool]] = {
    "max_denoising_steps": ("max_steps", int, 1, False), "t_min": ("t_min", (int, float), 0, False),
    "t_max": ("t_max", (int, float), 0, False), "stability_threshold": ("stability_threshold", int, 0, False),
    "confidence_threshold": ("confidence_threshold", float, 0, True),
    "entropy_bound": ("rule.gamma", float, 0, True)}  # its sampler_config's bound: EB's gamma


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


@dataclass
class _Session:
    """One batch's generation state: the encoder's cache and the decoder's masks and positions for the next canvas."""

    cache: Any
    keep: torch.Tensor  # [B, T] bool: the real tokens of everything encoded so far
    length: int = 0  # positions encoded so far (left padding included)
    decoder_mask: Any = None  # the decoder's attention masks over the cache and the canvas
    decoder_positions: torch.Tensor | None = None  # [1, L]
    view: tuple[tuple[int, ...], Any, Any] | None = None  # (rows, their cache, their masks) of the last row subset


class DiffusionGemmaNetwork(nn.Module):
    """A `DiffusionGemmaForBlockDiffusion` behind the `canvas` capability. `mask_id` is an id past the vocabulary:
    it marks the positions a caller wants filled and is never fed to the model nor drawn."""

    capabilities = frozenset({CANVAS})
    attention: AttentionKind = "block_causal"  # finished canvases sit, exactly, in the encoder's cache
    shifted_logits = False

    model: Any  # DiffusionGemmaForBlockDiffusion (typed loosely: transformers' classes are untyped)

    def __init__(self, model: Any, eos_ids: tuple[int, ...] = (), pad_id: int | None = None) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self._spec = CanvasSpec(int(config.canvas_length), int(config.text_config.vocab_size), eos_ids, pad_id)
        self.mask_id = self._spec.vocab_size
        self._image_ids = {i for i in (getattr(config, name, None) for name in
                                       ("image_token_id", "boi_token_id", "eoi_token_id")) if i is not None}

    @property
    def canvas(self) -> CanvasSpec:
        return self._spec

    @property
    def vocab_size(self) -> int:
        return self._spec.vocab_size

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, attn_mask: Any = None) -> torch.Tensor:
        raise CapabilityError("DiffusionGemma denoises revisable canvases, not masked sequences: decode it with "
                              "sampler=diffusion_gemma")

    def open(self, prompt: torch.Tensor, keep: torch.Tensor | None) -> _Session:
        from transformers import DynamicCache

        images = sorted(self._image_ids & set(prompt.unique().tolist()))
        if images:
            raise CapabilityError(f"DiffusionGemma runs text only here: the prompt holds image token ids {images}")
        keep = torch.ones_like(prompt, dtype=torch.bool) if keep is None else keep.bool()
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        return _Session(cache, keep)

    def encode(self, state: _Session, tokens: torch.Tensor) -> None:
        model, batch, width = self.model, tokens.shape[0], tokens.shape[1]
        if state.length:  # a finished canvas: its positions follow, all of them real
            state.keep = nn.functional.pad(state.keep, (0, width), value=True)
        device = tokens.device
        positions = torch.arange(state.length, state.length + width, dtype=torch.int32, device=device)[None]
        shape_only = torch.empty((batch, width, 0), dtype=model.dtype, device=device)
        masks = model.model.encoder.create_masks_for_generate(config=model.config, inputs_embeds=shape_only,
                                                              attention_mask=state.keep, cache=state.cache,
                                                              position_ids=positions)
        out = model.model.encoder(input_ids=tokens.contiguous(), attention_mask=masks, cache=state.cache,
                                  position_ids=positions)
        state.cache, state.length, state.view = out.cache, state.length + width, None
        length = self._spec.length
        state.decoder_positions = torch.arange(state.length, state.length + length, dtype=torch.int32,
                                               device=device)[None]
        # the decoder's masks depend only on shapes and the padding: made once per canvas (a long dummy, as the
        # reference passes its canvas, so the mask's dtype is the same)
        state.decoder_mask = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config, inputs_embeds=torch.zeros((batch, length, 1), dtype=torch.long, device=device),
            cache=state.cache, decoder_attention_mask=nn.functional.pad(state.keep, (0, length), value=True))

    def decode(self, state: _Session, canvas: torch.Tensor, self_conditioning: torch.Tensor | None,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        model = self.model
        if self_conditioning is not None:
            self_conditioning = self_conditioning.to(model.model.decoder.embed_tokens.weight.dtype)
        cache, masks = state.cache, state.decoder_mask
        if rows is not None and rows.numel() < state.keep.shape[0]:
            cache, masks = self._rows_view(state, rows)
        out = model(decoder_input_ids=canvas, self_conditioning_logits=self_conditioning,
                    decoder_attention_mask=masks, cache=cache, decoder_position_ids=state.decoder_positions)
        return out.logits.float()

    @staticmethod
    def _rows_view(state: _Session, rows: torch.Tensor) -> tuple[Any, Any]:
        """The encoder cache and decoder masks of batch rows `rows` alone (copies, made once per row set: the
        decoder only reads them). Each row's attention sees only its own entries, so its logits do not change."""
        key = tuple(rows.tolist())
        if state.view is None or state.view[0] != key:
            cache = copy.copy(state.cache)
            cache.layers = []
            for layer in state.cache.layers:
                part = copy.copy(layer)
                part.keys, part.values = layer.keys[rows], layer.values[rows]
                cache.layers.append(part)
            masks = {name: None if mask is None else mask[rows] for name, mask in state.decoder_mask.items()}
            state.view = (key, cache, masks)
        return state.view[1], state.view[2]


def end_ids(model: Any) -> tuple[tuple[int, ...], int | None]:
    """The end-of-text ids and the pad id `generate` uses: its generation config's, else the text config's."""
    generation, text = getattr(model, "generation_config", None), model.config.text_config
    eos = _ids(getattr(generation, "eos_token_id", None)) or _ids(text.eos_token_id)
    pad = getattr(generation, "pad_token_id", None)
    return eos, int(pad) if pad is not None else (None if text.pad_token_id is None else int(text.pad_token_id))


def wrap(model: Any) -> DiffusionGemmaNetwork:
    """A loaded (or freshly built) `DiffusionGemmaForBlockDiffusion` as mdmkit's network."""
    eos, pad = end_ids(model)
    return DiffusionGemmaNetwork(model.eval(), eos, pad)


def _generation_config(name_or_path: str) -> Path | None:
    """The checkpoint's generation_config.json, found as transformers finds it (a hub name's from the cache or the
    hub, honouring HF_HUB_OFFLINE); None where a directory has none, or a hub name's cannot be had (said in a line)."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local / GENERATION_CONFIG if (local / GENERATION_CONFIG).is_file() else None
    try:
        from transformers.utils import cached_file
    except ImportError:
        return None  # loading says in one line which transformers it needs
    try:
        found = cached_file(name_or_path, GENERATION_CONFIG)
    except OSError as error:  # transformers' loading then takes its defaults too
        print(f"[mdmkit] {name_or_path}: its {GENERATION_CONFIG} cannot be read here ({_first_line(error)}): "
              "sampler=diffusion_gemma keeps its preset's settings (transformers' defaults)")
        return None
    return None if found is None else Path(found)


def _setting(file: Path, name: str, value: Any, kind: type | tuple[type, ...], least: float, above: bool) -> Any:
    """One setting of `file`, checked as transformers' DiffusionGemmaGenerationConfig checks it (one line if not)."""
    typed = isinstance(value, kind) and not isinstance(value, bool)
    if not (typed and (value > least if above else value >= least)):
        wanted = "an integer" if kind is int else "a float" if kind is float else "a number"
        raise CheckpointError(f"{file}: {name}={json.dumps(value)} must be {wanted} {'>' if above else '>='} {least} "
                              "(transformers' generate refuses it)")
    return value if kind is int else float(value)


def sampler_settings(name_or_path: str) -> dict[str, Any]:
    """The fields of `sampler=diffusion_gemma` that a checkpoint's generation_config.json sets for its `generate`
    (an unset one is transformers' default, the preset's), read without the weights; a value its loading would
    refuse is one CheckpointError, now rather than after the weights load."""
    check_model_source(name_or_path)
    file = _generation_config(name_or_path)
    if file is None:
        return {}
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file} does not read as JSON: {_first_line(error)}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} holds {type(raw).__name__}, not a JSON object")
    sampler = raw.get("sampler_config")
    given = {**raw, "entropy_bound": sampler.get("entropy_bound") if isinstance(sampler, dict) else None}
    fields = {field: _setting(file, name, given[name], kind, least, above)
              for name, (field, kind, least, above) in _SETTINGS.items() if given.get(name) is not None}
    if "t_min" in fields and "t_max" in fields and fields["t_max"] <= fields["t_min"]:
        raise CheckpointError(f"{file}: t_max={given['t_max']} must be > t_min={given['t_min']} "
                              "(transformers' generate refuses it)")
    try:  # anything else transformers' loading would refuse (an unknown key, a sampler_config of no known class)
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

        DiffusionGemmaGenerationConfig.from_dict(raw)
    except ImportError:
        pass  # loading says in one line which transformers it needs
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise CheckpointError(f"{file}: transformers' DiffusionGemmaGenerationConfig refuses it: "
                              f"{_first_line(error)}") from None
    return fields


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load(name_or_path: str, kind: ModelKind, *, trust_remote_code: bool = False, dtype: str = "float32",
         device: str = "cpu", local_files_only: bool | None = None) -> tuple[DiffusionGemmaNetwork, Any]:
    """A DiffusionGemma directory (or hub name) through transformers' own classes, and its tokenizer (with its chat
    template); no remote code is ever run."""
    if dtype not in _DTYPES:
        raise CheckpointError(f"dtype='{dtype}': DiffusionGemma runs in {' or '.join(_DTYPES)}")
    check_model_source(name_or_path)
    local = Path(name_or_path).expanduser()
    source: str | Path = local if local.is_dir() else name_or_path
    offline = bool(local_files_only) or isinstance(source, Path)
    if isinstance(source, Path) and not any((source / name).is_file() for name in _TOKENIZER_FILES):
        # transformers would build a tokenizer of a few special tokens from a directory without its files
        raise CheckpointError(f"no {' nor '.join(_TOKENIZER_FILES)} in {name_or_path}: a DiffusionGemma directory "
                              "holds its tokenizer")
    try:
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion
    except ImportError as error:
        needs = f"this transformers has no DiffusionGemma ({error}): it needs transformers>=5.25"
        raise CheckpointError(needs) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model: Any = DiffusionGemmaForBlockDiffusion.from_pretrained(source, local_files_only=offline,
                                                                     dtype=_DTYPES[dtype])
    except Exception as error:
        first = _first_line(error)
        raise CheckpointError(f"cannot load a DiffusionGemma model from {name_or_path}: {first}") from error
    return wrap(model.to(device)), tokenizer


# the tiny example (python -m mdmkit.models.llm.tiny --kind diffusion_gemma): Gemma's chat tokens and template, its
# generation config ending a text at <eos> or <end_of_turn> as Gemma's does
SPECIALS = ("<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                 "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                 "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
EXAMPLE_CANVAS = 16


def example_config(vocab_size: int, ids: Mapping[str, int]) -> dict[str, Any]:
    """A 2-layer DiffusionGemma (width 64; a sliding and a full layer; 4 experts, 2 a token; canvases of 16) from
    transformers' own config classes, with a vision tower too small to weigh (text only runs here)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig

    text = DiffusionGemmaTextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096, num_experts=4,
        top_k_experts=2, moe_intermediate_size=32, pad_token_id=ids["<eos>"], eos_token_id=ids["<eos>"],
        bos_token_id=ids["<bos>"])
    vision = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "position_embedding_size": 64}
    config: dict[str, Any] = DiffusionGemmaConfig(text_config=text.to_dict(), vision_config=vision,
                                                  canvas_length=EXAMPLE_CANVAS).to_dict()
    return config


def example_weights(directory: Path, ids: Mapping[str, int], seed: int) -> None:
    """Seeded random weights (transformers' own initialisation) for the config.json in `directory`."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    config = DiffusionGemmaConfig.from_pretrained(directory)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = DiffusionGemmaForBlockDiffusion(config)
    model.generation_config.update(eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]], pad_token_id=ids["<eos>"])
    model.save_pretrained(directory)


KIND = register_kind(ModelKind(
    "diffusion_gemma", load, "DiffusionGemma: revisable block diffusion through transformers' own classes (text)",
    attention="block_causal",
    declares=lambda raw: str(raw.get("model_type", "")).lower() == "diffusion_gemma",
    example=ExampleModel(example_config, SPECIALS, "<mask>", CHAT_TEMPLATE, bos="<bos>", weights=example_weights),
    sampler="diffusion_gemma",  # its own generate; a masked sampler cannot run on its canvases
    sampler_settings=sampler_settings,
))

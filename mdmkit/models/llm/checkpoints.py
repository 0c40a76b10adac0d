"""Hub checkpoints (config.json and safetensors) of LLaDA, Dream, Fast-dLLM v2, LLaDA-MoE and LLaDA2.0 read into
mdmkit's `DiffusionLM`, without their remote code (the mixtures of experts' parts: `moe_checkpoints`).

Each architecture maps its config.json to a `DiffusionLMConfig`, refusing in one line any setting the network does
not implement (so a checkpoint never loads into different arithmetic), and its tensor names to parameters. The
network is built on the meta device and filled one tensor at a time, so an 8B model is never materialised twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.models.llm.moe import MoEConfig
from mdmkit.models.llm.moe_checkpoints import Slot, llada2_config, llada2_names, llada_moe_config, llada_moe_names

LLADA_MASK_ID = 126336  # LLaDA's [MASK] id (its model card, generate.py and config.json's mask_token_id)
DREAM_MASK_ID = 151666  # DreamConfig's default mask_token_id
FAST_DLLM_V2_MASK_ID = 151665  # Fast-dLLM v2's `|<MASK>|` (its generate's default mask_id; not in its config.json)
FAST_DLLM_V2_BLOCK = 32  # the block its forward's attention is built for (its `bd_size` in every released config)
_REQUIRED = object()


class _Fields:
    """Typed reads of one config.json, each failure a one-line CheckpointError naming the file and field."""

    def __init__(self, raw: dict[str, Any], source: Path) -> None:
        self.raw, self.source = raw, source

    def get(self, name: str, default: Any = _REQUIRED, kind: type = int) -> Any:
        value = self.raw.get(name)
        if value is None:
            if default is _REQUIRED:
                raise CheckpointError(f"{self.source}: config field '{name}' is missing")
            return default
        if kind is bool and not isinstance(value, bool):
            raise CheckpointError(f"{self.source}: config field {name}={value!r} is not a boolean")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise CheckpointError(f"{self.source}: config field {name}={value!r} is not a {kind.__name__}") from None

    def refuse(self, name: str, supported: Any, default: Any) -> None:
        """Refuse a value of `name` other than `supported` (`default` when the field is absent)."""
        value = self.raw.get(name, default)
        if value != supported:
            raise CheckpointError(f"{self.source}: {name}={value!r} is not supported by mdmkit's network "
                                  f"(only {supported!r})")

    def plain_rope(self) -> None:
        """Refuse a `rope_scaling` other than none or the default."""
        scaling = self.raw.get("rope_scaling")
        if not (scaling is None or isinstance(scaling, dict)
                and scaling.get("rope_type", scaling.get("type")) == "default"):
            raise CheckpointError(f"{self.source}: rope_scaling={scaling!r} is not supported by mdmkit's network "
                                  "(only null)")


def _llada_config(fields: _Fields) -> dict[str, Any]:
    # Absent fields take the defaults of LLaDA's ModelConfig, so a config that relies on them is read as LLaDA would.
    for name, supported, default in [("block_type", "llama", "sequential"), ("alibi", False, False),
                                     ("rope", True, False), ("layer_norm_type", "rms", "default"),
                                     ("activation_type", "silu", "swiglu"), ("attention_layer_norm", False, False),
                                     ("include_bias", False, False), ("layer_norm_with_affine", True, True),
                                     ("block_group_size", 1, 1), ("input_emb_norm", False, False),
                                     ("scale_logits", False, False)]:
        fields.refuse(name, supported, default)
    if fields.raw.get("bias_for_layer_norm"):
        fields.refuse("bias_for_layer_norm", False, False)
    n_heads = fields.get("n_heads")
    n_kv_heads = fields.get("n_kv_heads", None)
    multi_query = fields.raw.get("multi_query_attention")
    if n_kv_heads is None:
        n_kv_heads = 1 if multi_query else n_heads
    elif multi_query is not None and n_kv_heads != (1 if multi_query else n_heads):
        raise CheckpointError(f"{fields.source}: n_kv_heads={n_kv_heads} contradicts "
                              f"multi_query_attention={multi_query}")
    d_model = fields.get("d_model")
    return {
        "vocab_size": fields.get("embedding_size", None) or fields.get("vocab_size"),
        "d_model": d_model,
        "n_layers": fields.get("n_layers"),
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "mlp_hidden": fields.get("mlp_hidden_size", None) or fields.get("mlp_ratio", 4) * d_model,
        "mask_id": fields.get("mask_token_id", LLADA_MASK_ID),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-5, float),
        "max_positions": fields.get("max_sequence_length", 1024),
        "qkv_bias": fields.get("include_qkv_bias", False, bool),
        "tie_embeddings": fields.get("weight_tying", True, bool),
        "rope_fp32": fields.get("rope_full_precision", True, bool),
    }


def _qwen2_checks(fields: _Fields) -> None:
    fields.refuse("hidden_act", "silu", "silu")
    fields.refuse("use_sliding_window", False, False)
    fields.plain_rope()


def _qwen2_shape(fields: _Fields, mask_id: int) -> dict[str, Any]:
    """The fields Dream and Fast-dLLM v2 share with Qwen2: sizes, q/k/v biases, rotary in the weights' dtype."""
    n_heads = fields.get("num_attention_heads")
    return {
        "vocab_size": fields.get("vocab_size"),
        "d_model": fields.get("hidden_size"),
        "n_layers": fields.get("num_hidden_layers"),
        "n_heads": n_heads,
        "n_kv_heads": fields.get("num_key_value_heads", n_heads),
        "mlp_hidden": fields.get("intermediate_size"),
        "mask_id": fields.get("mask_token_id", mask_id),
        "rope_theta": fields.get("rope_theta", 10000.0, float),
        "rms_eps": fields.get("rms_norm_eps", 1e-6, float),
        "max_positions": fields.get("max_position_embeddings", 32768),
        "qkv_bias": True,
        "tie_embeddings": fields.get("tie_word_embeddings", False, bool),
        "rope_fp32": False,  # Qwen2 casts cos/sin to the weights' dtype and rotates there
        "pad_positions": True,  # position ids = cumsum(attention_mask) - 1 (Dream's sampler; blocks from 0 per row)
        "shift_logits": True,
    }


def _dream_config(fields: _Fields) -> dict[str, Any]:
    """DreamConfig -> DiffusionLMConfig fields; absent fields take that class's defaults."""
    _qwen2_checks(fields)
    fields.refuse("use_mrope", False, False)
    return _qwen2_shape(fields, DREAM_MASK_ID)


def _fast_dllm_v2_config(fields: _Fields) -> dict[str, Any]:
    # Fast_dLLM_QwenConfig (a Qwen2Config with `bd_size`); its q/k/v biases are always on, its training-only
    # fields (`conplemenrary_mask`) do not change inference.
    _qwen2_checks(fields)
    layer_types = fields.raw.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise CheckpointError(f"{fields.source}: layer_types={layer_types!r} is not supported by mdmkit's network "
                              "(only full_attention)")
    return {**_qwen2_shape(fields, FAST_DLLM_V2_MASK_ID),
            "attention_block": fields.get("bd_size", FAST_DLLM_V2_BLOCK)}


@dataclass(frozen=True)
class Architecture:
    """One hub architecture: its config.json reader and its tensor names (hub name -> parameter name)."""

    read: Callable[[_Fields], dict[str, Any]]
    top: dict[str, str]  # outside the blocks; the output layer is "head.weight"
    block: str  # hub prefix of block {i}
    parts: dict[str, str]  # inside a block, hub suffix -> parameter suffix
    qkv: tuple[str, str, str]  # hub suffixes of the q, k, v projections (their biases follow with qkv_bias)
    layout: Callable[[DiffusionLMConfig], dict[str, Any]] | None = None  # instead of the maps above (MoE models)

    def names(self, config: DiffusionLMConfig) -> dict[str, Any]:
        """Hub name -> parameter name, or the `Slot`(s) it fills."""
        if self.layout is not None:
            return self.layout(config)
        names = {hub: own for hub, own in self.top.items() if not (config.tie_embeddings and own == "head.weight")}
        parts = dict(self.parts)
        if config.qkv_bias:
            parts.update({f"{hub}.bias": f"attn.{own}.bias" for hub, own in zip(self.qkv, "qkv")})
        for i in range(config.n_layers):
            names.update({self.block.format(i=i) + hub: f"blocks.{i}.{own}" for hub, own in parts.items()})
        return names


_LLADA = Architecture(
    _llada_config,
    top={"model.transformer.wte.weight": "embed.weight", "model.transformer.ln_f.weight": "norm.weight",
         "model.transformer.ff_out.weight": "head.weight"},
    block="model.transformer.blocks.{i}.",
    parts={"q_proj.weight": "attn.q.weight", "k_proj.weight": "attn.k.weight", "v_proj.weight": "attn.v.weight",
           "attn_out.weight": "attn.o.weight", "ff_proj.weight": "mlp.gate.weight", "up_proj.weight": "mlp.up.weight",
           "ff_out.weight": "mlp.down.weight", "attn_norm.weight": "attn_norm.weight",
           "ff_norm.weight": "mlp_norm.weight"},
    qkv=("q_proj", "k_proj", "v_proj"),
)
_DREAM = Architecture(
    _dream_config,
    top={"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
         "lm_head.weight": "head.weight"},
    block="model.layers.{i}.",
    parts={"self_attn.q_proj.weight": "attn.q.weight", "self_attn.k_proj.weight": "attn.k.weight",
           "self_attn.v_proj.weight": "attn.v.weight", "self_attn.o_proj.weight": "attn.o.weight",
           "mlp.gate_proj.weight": "mlp.gate.weight", "mlp.up_proj.weight": "mlp.up.weight",
           "mlp.down_proj.weight": "mlp.down.weight", "input_layernorm.weight": "attn_norm.weight",
           "post_attention_layernorm.weight": "mlp_norm.weight"},
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
)


_FAST_DLLM_V2 = Architecture(_fast_dllm_v2_config, top=_DREAM.top, block=_DREAM.block, parts=_DREAM.parts,
                             qkv=_DREAM.qkv)  # the hub tensor names are Qwen2's, as Dream's
_LLADA_MOE = Architecture(llada_moe_config, top={}, block="", parts={}, qkv=("", "", ""), layout=llada_moe_names)
_LLADA2 = Architecture(llada2_config, top={}, block="", parts={}, qkv=("", "", ""), layout=llada2_names)
ARCHITECTURES = {"llada": _LLADA, "dream": _DREAM, "fast_dllm_v2": _FAST_DLLM_V2, "llada_moe": _LLADA_MOE,
                 "llada2": _LLADA2}
MODEL_TYPES = {"llada": "llada", "dream": "dream", "fast_dllm_qwen": "fast_dllm_v2",  # config.json model_type -> kind
               "lladamoe": "llada_moe", "llada2_moe": "llada2"}


def declared_kind(raw: dict[str, Any]) -> str | None:
    """The kind a config.json declares (LLaDA-MoE's hub config says model_type llada, as LLaDA's: its architecture
    names it)."""
    declared = MODEL_TYPES.get(str(raw.get("model_type", "")).lower())
    if declared == "llada" and "LLaDAMoEModelLM" in (raw.get("architectures") or []):
        return "llada_moe"
    return declared


def read_config(directory: Path, kind: str, mask_id: int | None = None) -> DiffusionLMConfig:
    """The network config of the checkpoint in `directory`, read as a `kind` (a key of ARCHITECTURES)
    config.json; `mask_id` overrides the config's (Fast-dLLM v2 names its mask token only in its tokenizer)."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    declared = declared_kind(raw)
    if declared is not None and declared != kind:
        raise CheckpointError(f"{path}: a {raw['model_type']} checkpoint (model_type), not {kind}: load it as "
                              f"kind {declared} (hf.kind={declared})")
    try:
        read = ARCHITECTURES[kind].read(_Fields(raw, path))
        if read.get("moe") is not None:
            read["moe"] = MoEConfig(**read["moe"])
        return DiffusionLMConfig(**{**read, **({} if mask_id is None else {"mask_id": mask_id})})
    except ConfigError as error:
        raise CheckpointError(f"{path}: {error}") from None


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: `model.safetensors`, or the shards its index names."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            raise CheckpointError(f"{index}: not a safetensors index (no weight_map)") from None
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise CheckpointError(f"{index} names {len(missing)} missing shard(s), e.g. {missing[0]}")
        return [directory / name for name in shards]
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    if any(directory.glob("pytorch_model*.bin")):
        raise CheckpointError(f"{directory}: only safetensors weights are supported (found pytorch_model*.bin)")
    raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _stored_shape(slots: list[Slot], shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The shape the hub tensor filling `slots` must have: a parameter's, an expert's, or the fused rows'."""
    first = slots[0]
    if first.rows is not None:
        return (max(slot.rows[1] for slot in slots if slot.rows), *shapes[first.name][1:])
    return shapes[first.name] if first.index is None else shapes[first.name][1:]


def _place(state: dict[str, torch.Tensor], slots: list[Slot], tensor: torch.Tensor,
           shapes: dict[str, tuple[int, ...]]) -> None:
    for slot in slots:
        part = tensor if slot.rows is None else tensor[slot.rows[0]: slot.rows[1]].contiguous()
        if slot.index is None:
            state[slot.name] = part
            continue
        if slot.name not in state:  # a stacked parameter, filled one expert at a time
            state[slot.name] = tensor.new_empty(shapes[slot.name])
        state[slot.name][slot.index] = part


def load_diffusion_lm(directory: str | Path, kind: str, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu", mask_id: int | None = None) -> DiffusionLM:
    """The checkpoint in `directory` (`kind` a key of ARCHITECTURES) as a `DiffusionLM` in eval mode; `mask_id` as
    `read_config`'s."""
    from safetensors import SafetensorError, safe_open

    if kind not in ARCHITECTURES:
        raise CheckpointError(f"kind='{kind}' has no native network (one of {', '.join(ARCHITECTURES)})")
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise CheckpointError(f"no model directory at {directory}")
    config = read_config(directory, kind, mask_id)
    names = ARCHITECTURES[kind].names(config)
    with torch.device("meta"):
        network = DiffusionLM(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in network.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    for file in weight_files(directory):
        try:
            with safe_open(str(file), framework="pt") as handle:
                stored = handle.keys()  # a safetensors handle is not a dict: it lists its tensors here
                for name in stored:
                    target = names.get(name)
                    if target is None:
                        tied_head = config.tie_embeddings and name == "lm_head.weight"
                        if name.endswith("rotary_emb.inv_freq") or name in ARCHITECTURES[kind].top or tied_head:
                            continue  # recomputed from rope_theta / a tied output layer saved anyway
                        raise CheckpointError(f"{file}: unexpected tensor '{name}' for this {kind} config")
                    slots = [Slot(target)] if isinstance(target, str) else [target] if isinstance(target, Slot) \
                        else target
                    shape = tuple(handle.get_slice(name).get_shape())
                    implied = _stored_shape(slots, shapes)
                    if shape != implied:
                        raise CheckpointError(f"{file}: tensor '{name}' has shape {list(shape)}, the config "
                                              f"implies {list(implied)}")
                    tensor = handle.get_tensor(name).to(dtype).to(device)  # one tensor in memory at a time
                    _place(state, slots, tensor, shapes)
                    seen.add(name)
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{file}: unreadable safetensors ({error})") from None
    missing = sorted(set(names) - seen)
    if missing:
        raise CheckpointError(f"{directory}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
                              f"'{missing[0]}'")
    network.load_state_dict(state, assign=True)
    return network.eval()

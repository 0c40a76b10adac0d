"""Hugging Face models behind mdmkit's network interface (`network(tokens, attn_mask) -> logits [B, L, V]`).

A BERT-style masked LM is wrapped so every sampler runs on it, a causal LM so it decodes through the causal
samplers (`ntp`, SBD); the native kinds (LLaDA, Dream, ...) load into mdmkit's own `DiffusionLM` without their
remote code (docs/llm.md). `transformers` (the `eval` extra) is imported only when a model is loaded.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from mdmkit.core.config import Validated
from mdmkit.core.errors import CheckpointError
from mdmkit.models.denoiser import KV_CACHE, AttentionKind, KVCache, positions_from
from mdmkit.models.llm.checkpoints import load_diffusion_lm, read_config
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.registry import model_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mdmkit.models.llm.registry import ModelKind
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_BPE_FILES = ("vocab.json", "merges.txt")  # a byte-level BPE without tokenizer.json (Dream's hub files)


def key_padding(attn_mask: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """mdmkit's key-padding mask (bool, broadcastable to [B, heads, L, L]) as a [B, L] bool, or None.

    Only masks that are the same for every query (key padding) translate to HF's [B, L] `attention_mask`;
    anything else is refused rather than silently approximated.
    """
    if attn_mask is None:
        return None
    mask = attn_mask.bool()
    if mask.dim() == 2:
        return mask.expand(batch, length)
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        raise ValueError(f"only a key-padding mask [B, 1, 1, L] converts to an HF attention_mask, got "
                         f"{tuple(mask.shape)}")
    return mask[:, 0, 0, :].expand(batch, length)


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one layer of a transformers cache (newer releases: `.layers`, older: lists)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class HFMaskedDiffusion(nn.Module):
    """A Hugging Face masked LM as an mdmkit network: `forward(tokens, attn_mask) -> logits [B, L, V]`.

    `shift=True` is for a model whose logits at position i-1 predict token i: they are re-aligned with
    `cat([logits[:, :1], logits[:, :-1]], 1)` (position 0 keeps its own), so samplers see logits aligned with
    the positions they fill.
    """

    attention: AttentionKind = "bidirectional"

    def __init__(self, model: nn.Module, mask_id: int, *, shift: bool = False) -> None:
        super().__init__()
        self.model = model
        self.mask_id = int(mask_id)
        self.shift = shift
        # Position ids computed from the padding mask make left padding exact for models that take them (BERT).
        self.pass_positions = _accepts(model, "position_ids")

    @property
    def shifted_logits(self) -> bool:
        """With `shift`, position i's logits are the model's output at i - 1."""
        return self.shift

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, length = tokens.shape
        keep = key_padding(attn_mask, batch, length)
        kwargs: dict[str, Any] = {}
        if keep is not None:
            kwargs["attention_mask"] = keep.long()
            if self.pass_positions and not bool(keep.all()):
                kwargs["position_ids"] = positions_from(keep)
        logits = self.model(input_ids=tokens, **kwargs).logits.float()
        if self.shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM as a `kv_cache` network: NTP baselines (and SBD fine-tunes) decode it through
    `NTPDecoder` / `SBDSampler` and the forward counter, like mdmkit's own causal models."""

    capabilities = frozenset({KV_CACHE})
    attention: AttentionKind = "causal"
    shifted_logits = False  # position i's logits predict token i + 1, as a causal LM's do: no re-alignment

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = cast("PreTrainedModel", model)  # AutoModelForCausalLM's, whose config and heads this reads

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def vocab_size(self) -> int:
        """One past the largest token id the model reads or writes (its embedding and output rows)."""
        sizes = [cast(nn.Embedding, self.model.get_input_embeddings()).num_embeddings]  # typed a plain Module
        output = self.model.get_output_embeddings()
        if output is not None:
            sizes.append(output.weight.shape[0])
        return int(max(sizes))

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, cache: KVCache | None = None, commit: int = 0) -> torch.Tensor:
        """Logits [B, L, V]. A key-padding mask works as for any mdmkit network; a full bool mask
        [B or 1, 1, L, cache + L] with explicit `positions` (SBD training) and an mdmkit `KVCache` (NTP and
        SBD decoding) goes to the model as a 4D mask, position ids and a DynamicCache built from, and written
        back to, `cache`.
        """
        batch, length = tokens.shape
        kwargs: dict[str, Any] = {}
        if cache is None and positions is None and (attn_mask is None or attn_mask.shape[-2] == 1):
            keep = key_padding(attn_mask, batch, length)
            if keep is not None:
                kwargs.update(attention_mask=keep.long(), position_ids=positions_from(keep))
            return self.model(input_ids=tokens, **kwargs).logits.float()
        if attn_mask is not None:
            kwargs["attention_mask"] = attn_mask.bool().expand(batch, 1, length, attn_mask.shape[-1])
        if positions is not None:
            kwargs["position_ids"] = positions
        if cache is None:
            return self.model(input_ids=tokens, **kwargs).logits.float()
        from transformers import DynamicCache

        past, before = DynamicCache(), cache.length
        for layer, (keys, values) in enumerate(zip(cache.keys, cache.values)):
            if keys is not None and values is not None:
                past.update(keys, values, layer)
        logits = self.model(input_ids=tokens, past_key_values=past, use_cache=True, **kwargs).logits.float()
        if commit:
            for layer in range(self.n_layers):
                keys, values = _layer_kv(past, layer)
                cache.keys[layer] = keys[:, :, : before + commit]
                cache.values[layer] = values[:, :, : before + commit]
        return logits


@dataclass
class HFCausalSpec(Validated):
    """`model=hf_causal`: train (e.g. SBD fine-tune) a Hugging Face causal LM on an mdmkit task, whose token ids
    index the model's vocabulary directly (a tiny model made for the task, or a tokenizer-aligned task); `vocab_size`
    and `max_len` come from the task."""

    path: str
    vocab_size: int
    max_len: int
    dtype: str = "float32"
    trust_remote_code: bool = False

    def build(self) -> HFCausalLM:
        network, _ = load_causal_lm(self.path, trust_remote_code=self.trust_remote_code, dtype=self.dtype,
                                    with_tokenizer=False)
        config = network.model.config
        if config.vocab_size < self.vocab_size:
            raise CheckpointError(f"{self.path}: vocabulary {config.vocab_size} is smaller than the task's "
                                  f"{self.vocab_size}")
        if getattr(config, "max_position_embeddings", self.max_len) < self.max_len:
            raise CheckpointError(f"{self.path}: {config.max_position_embeddings} positions, the task needs "
                                  f"{self.max_len}")
        return network.train()


def _is_local(name_or_path: str) -> bool:
    return name_or_path.startswith(("/", "./", "../", "~")) or Path(name_or_path).exists()


def check_model_source(name_or_path: str) -> None:
    """A local path must be a model directory (a hub name is looked up when it loads)."""
    if _is_local(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise CheckpointError(f"no model directory at {name_or_path}")


def _load_kwargs(name_or_path: str, dtype: str, local_files_only: bool | None) -> tuple[Path | str, dict]:
    if dtype not in _DTYPES:
        raise CheckpointError(f"dtype='{dtype}' is not one of {', '.join(_DTYPES)}")
    check_model_source(name_or_path)
    source: Path | str = name_or_path
    if _is_local(name_or_path):
        source, local_files_only = Path(name_or_path).expanduser(), True  # a local directory never touches the network
    return source, {"local_files_only": bool(local_files_only)}


def _load_auto(auto_class: str, what: str, name_or_path: str, trust_remote_code: bool, dtype: str,
               local_files_only: bool | None, with_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    """`transformers.<auto_class>` and its tokenizer (None without `with_tokenizer`), or one CheckpointError."""
    import transformers
    from packaging.version import Version

    source, common = _load_kwargs(name_or_path, dtype, local_files_only)
    # transformers renamed `torch_dtype` to `dtype` in 4.56; older releases only know the former.
    dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    try:
        tokenizer = (transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **common)
                     if with_tokenizer else None)
        model = getattr(transformers, auto_class).from_pretrained(source, trust_remote_code=trust_remote_code,
                                                                  **common, **{dtype_key: _DTYPES[dtype]})
    except Exception as error:
        raise CheckpointError(f"cannot load a {what} from {name_or_path}: {_first_line(error)}") from error
    return model, tokenizer


def load_generic(name_or_path: str, kind: ModelKind | None = None, *, trust_remote_code: bool = False,
                 dtype: str = "float32", device: str = "cpu",
                 local_files_only: bool | None = None) -> tuple[HFMaskedDiffusion, Any]:
    """Any AutoModelForMaskedLM with a mask token, wrapped, and its tokenizer."""
    model, tokenizer = _load_auto("AutoModelForMaskedLM", "masked LM", name_or_path, trust_remote_code, dtype,
                                  local_files_only)
    if tokenizer.mask_token_id is None:
        raise CheckpointError(f"the tokenizer of {name_or_path} has no mask token: a masked diffusion "
                              "model needs one")
    return HFMaskedDiffusion(model.to(device).eval(), tokenizer.mask_token_id), tokenizer


def load_native(
    name_or_path: str,
    kind: str | ModelKind,
    *,
    trust_remote_code: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
    local_files_only: bool | None = None,
) -> tuple[DiffusionLM, Any]:
    """A native checkpoint (a directory, or a hub name fetched once) as mdmkit's `DiffusionLM`, and its tokenizer.

    The mask id is the config's `mask_token_id` (LLaDA's tokenizer declares none), or for a kind with a
    `tokenizer_mask` the tokenizer's. No remote code runs unless `trust_remote_code` (then only the tokenizer's).
    """
    record = model_kind(kind) if isinstance(kind, str) else kind
    kind = record.name
    source, common = _load_kwargs(name_or_path, dtype, local_files_only)
    directory = source if isinstance(source, Path) else _fetch(source, trust_remote_code, **common)
    # refuse a config of another kind or a missing tokenizer before reading the weights (a tokenizer_mask kind's
    # mask id is checked once its tokenizer has named it)
    read_config(directory, kind, mask_id=0 if record.tokenizer_mask else None)
    try:
        tokenizer = native_tokenizer(directory, record, trust_remote_code=trust_remote_code, **common)
    except CheckpointError as error:
        raise CheckpointError(f"cannot load the tokenizer of {name_or_path}: {error}") from None
    network = load_diffusion_lm(directory, kind, _DTYPES[dtype], device, _tokenizer_mask_id(tokenizer, record))
    if tokenizer.mask_token_id is not None and tokenizer.mask_token_id != network.mask_id:
        raise CheckpointError(f"{name_or_path}: the tokenizer's mask token {tokenizer.mask_token_id} is not the "
                              f"config's mask_token_id {network.mask_id}")
    return network, tokenizer


def _not_foreign_model_type(record: logging.LogRecord) -> bool:
    """Drops transformers' "You are using a model of type llada to instantiate a model of type ...", logged on every
    tokenizer load of a model it has no class for: mdmkit builds the network itself, so the line is noise."""
    return "to instantiate a model of type" not in record.getMessage()


def _tokenizer_mask_id(tokenizer: Any, kind: ModelKind) -> int | None:
    """The mask id of a kind with a `tokenizer_mask`, read from its tokenizer (None for the other kinds)."""
    token = kind.tokenizer_mask
    if token is None:
        return None
    mask_id = tokenizer.convert_tokens_to_ids(token)
    if mask_id is None or mask_id == tokenizer.unk_token_id:
        raise CheckpointError(f"the tokenizer has no {token} token ({kind.name}'s mask)")
    return int(mask_id)


def native_tokenizer(directory: Path, kind: str | ModelKind, *, trust_remote_code: bool = False,
                     local_files_only: bool = True) -> Any:
    """The tokenizer of a native checkpoint directory, through AutoTokenizer, with the kind's `tokenizer_options`
    (Dream's names remote code: untrusted, it loads as transformers' own Qwen2 tokenizer)."""
    from transformers import AutoTokenizer

    record = model_kind(kind) if isinstance(kind, str) else kind
    # transformers' Qwen2 tokenizer would build an empty vocabulary from a directory without its files
    if not (directory / "tokenizer.json").is_file() and not all((directory / f).is_file() for f in _BPE_FILES):
        raise CheckpointError(f"no tokenizer.json, nor {' and '.join(_BPE_FILES)} in {directory}")
    extra = record.tokenizer_options(trust_remote_code)
    logging.getLogger("transformers.configuration_utils").addFilter(_not_foreign_model_type)  # added once
    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code,
                                             local_files_only=local_files_only, **extra)
    except Exception as error:
        raise CheckpointError(_first_line(error)) from error


def _fetch(name: str, trust_remote_code: bool, local_files_only: bool) -> Path:
    """The local snapshot of hub model `name`: configs, tokenizer files and safetensors (code only if trusted)."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"] + (["*.py"] if trust_remote_code else [])
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=local_files_only))
    except Exception as error:
        raise CheckpointError(f"cannot fetch {name} from the hub: {_first_line(error)}") from error


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_causal_lm(
    name_or_path: str,
    *,
    trust_remote_code: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
    local_files_only: bool | None = None,
    with_tokenizer: bool = True,
) -> tuple[HFCausalLM, Any]:
    """Wrapped AutoModelForCausalLM and its tokenizer (None without `with_tokenizer`, for models that read
    task token ids directly)."""
    model, tokenizer = _load_auto("AutoModelForCausalLM", "causal LM", name_or_path, trust_remote_code, dtype,
                                  local_files_only, with_tokenizer)
    return HFCausalLM(model.to(device).eval()), tokenizer


def load_causal(name_or_path: str, kind: ModelKind | None = None, *, trust_remote_code: bool = False,
                dtype: str = "float32", device: str = "cpu",
                local_files_only: bool | None = None) -> tuple[HFCausalLM, Any]:
    """`load_causal_lm` as a model kind's loader."""
    return load_causal_lm(name_or_path, trust_remote_code=trust_remote_code, dtype=dtype, device=device,
                          local_files_only=local_files_only)

"""One record per model kind: everything the rest of mdmkit asks about a kind of pretrained model, in one place.

`hf.kind=<name>`, the lm-eval model's `kind=`, `sft.kind=`, the hub-layout save and the benchmarks all read the
record; nothing elsewhere lists kinds. A kind is one module that calls `register_kind`: the built-in ones live in
`mdmkit.models.llm.kinds` (found by listing that package), a plugin's in its own package, named by an entry point in
the group `mdmkit.model_kinds` (its module is imported, or the `ModelKind` it names registered), or registered from
Python before use. docs/extending.md walks through adding one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from torch import nn

from mdmkit.core.errors import ConfigError
from mdmkit.models.denoiser import AttentionKind
from mdmkit.models.llm.diffusion_lm import DiffusionLMConfig
from mdmkit.models.llm.hub_format import Architecture

ENTRY_POINTS = "mdmkit.model_kinds"


class Loader(Protocol):
    """Loads a model directory (or hub name) of `kind`: the network behind mdmkit's interface and its tokenizer."""

    def __call__(self, name_or_path: str, kind: ModelKind, *, trust_remote_code: bool = False,
                 dtype: str = "float32", device: str = "cpu",
                 local_files_only: bool | None = None) -> tuple[nn.Module, Any]: ...


def _declares_nothing(raw: Mapping[str, Any]) -> bool:
    return False


def _no_tokenizer_options(trust_remote_code: bool) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ExampleModel:
    """How a tiny model of a kind is made to try the commands offline (`mdmkit.models.llm.tiny`). Its tokenizer is
    the 256 bytes, then `specials` (end of text first; `bos` one of them or None), then the `mask` token, with
    `chat_template`; `declare_mask`: the tokenizer names `mask` as its mask token (Dream's does, LLaDA's does not).
    `config`: the config.json of a small network from the vocabulary size and the special tokens' ids. `weights`:
    writes seeded random weights for that config.json into the directory (None: mdmkit's own network, saved in the
    kind's hub layout), for kinds that run through transformers' classes."""

    config: Callable[[int, Mapping[str, int]], dict[str, Any]]
    specials: tuple[str, ...]
    mask: str
    chat_template: str
    bos: str | None = None
    declare_mask: bool = False
    weights: Callable[[Path, Mapping[str, int], int], None] | None = None


@dataclass(frozen=True)
class ModelKind:
    """What one kind of model is. `architecture`: its hub format, for kinds that load into mdmkit's own network
    (None: the model runs through transformers). `declares`: whether a config.json says it is of this kind (a
    mismatch with the kind asked for is refused, naming the right one). `tokenizer_mask`: the token whose id is the
    mask id when config.json names none. `decoding`: "causal" kinds decode left to right (NTP / SBD samplers).
    `lora`: LoRA adapters attach to its blocks' plain module names. `export`: it saves back in the hub layout.
    `sft_normalize`: the loss normalisation of its published fine-tuning recipe (None: not fine-tunable here).
    `shapes`: real-size configs by name, for the benchmarks. `example`: a tiny model of it that users can make.
    `sampler`: the conf/sampler option a text evaluation (evaluate.py, mdmkit-lm-eval, `api.kind_sampler`) uses
    when none is named; None: `ntp` for a causal kind, else `eb`. `sampler_settings`: the fields of that sampler
    (dotted for a nested sampler's, `rule.gamma`) that a model directory or hub name sets for itself, read without
    loading its weights (a value its loading would refuse: one CheckpointError); a text evaluation naming no sampler
    follows them, under the fields its user sets (None: the option as it is)."""

    name: str
    load: Loader
    summary: str
    attention: AttentionKind = "bidirectional"
    decoding: Literal["masked", "causal"] = "masked"
    architecture: Architecture | None = None
    declares: Callable[[Mapping[str, Any]], bool] = _declares_nothing
    tokenizer_mask: str | None = None
    tokenizer_options: Callable[[bool], dict[str, Any]] = _no_tokenizer_options
    lora: bool = False
    export: bool = False
    sft_normalize: Literal["sequence", "tokens"] | None = None
    shapes: Mapping[str, DiffusionLMConfig] = field(default_factory=dict)
    example: ExampleModel | None = None
    sampler: str | None = None
    sampler_settings: Callable[[str], Mapping[str, Any]] | None = None

    @property
    def default_sampler(self) -> str:
        """The conf/sampler option a text evaluation uses when none is named (see `sampler`)."""
        return self.sampler or ("ntp" if self.decoding == "causal" else "eb")


_KINDS: dict[str, ModelKind] = {}
_discovered = False


def register_kind(kind: ModelKind, *, replace: bool = False) -> ModelKind:
    """Make `kind` known by its name (refused if the name is taken, unless `replace`); returns it."""
    if kind.name in _KINDS and _KINDS[kind.name] is not kind and not replace:
        raise ConfigError(f"a model kind named '{kind.name}' is already registered")
    _KINDS[kind.name] = kind
    return kind


def _discover() -> None:
    """Import the built-in kinds' modules and the plugins' entry points, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    from mdmkit.models.llm import kinds

    for module in pkgutil.iter_modules(kinds.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{kinds.__name__}.{module.name}")
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 (a plugin may raise anything: one line names it)
            raise ConfigError(f"model kind plugin '{entry.name}' ({entry.value}) failed to import: {error}") from None
        if isinstance(loaded, ModelKind):
            register_kind(loaded)


def model_kinds() -> tuple[ModelKind, ...]:
    """Every known kind, built-in ones first."""
    _discover()
    return tuple(_KINDS.values())


def kind_names(where: Callable[[ModelKind], bool] = lambda kind: True) -> tuple[str, ...]:
    return tuple(kind.name for kind in model_kinds() if where(kind))


def model_kind(name: str, where: Callable[[ModelKind], bool] = lambda kind: True, what: str = "") -> ModelKind:
    """The kind called `name`; one ConfigError listing the choices if there is none (or it fails `where`, then
    saying `what` the caller needed)."""
    _discover()
    kind = _KINDS.get(name)
    if kind is None or not where(kind):
        choices = ", ".join(kind_names(where))
        raise ConfigError(f"kind='{name}' is not one of {choices}" + (f" ({what})" if what else ""))
    return kind


def declared_kind(raw: Mapping[str, Any]) -> ModelKind | None:
    """The kind a config.json declares, if any does."""
    return next((kind for kind in model_kinds() if kind.declares(raw)), None)


def load_model(name_or_path: str, kind: str = "generic", *, trust_remote_code: bool = False, dtype: str = "float32",
               device: str = "cpu", local_files_only: bool | None = None) -> tuple[nn.Module, Any]:
    """The network and tokenizer of a model directory or hub name, loaded as `kind`."""
    record = model_kind(kind)
    return record.load(name_or_path, record, trust_remote_code=trust_remote_code, dtype=dtype, device=device,
                       local_files_only=local_files_only)

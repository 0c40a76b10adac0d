"""LoRA on mdmkit's DiffusionLM through `peft`: adapters injected in place, merged into plain weights on save.

`peft` (the `sft` extra) is imported only when an adapter is made or read.

Merging works on a state dict, not on modules, so it runs the same on weights that FSDP gathered from its shards.
The adapter alone is written in peft's own format (adapter_config.json + adapter_model.safetensors, keys under
`base_model.model.`), which `peft.PeftModel.from_pretrained` and `load_adapter` below read, beside the record of
the base it was trained on (`adapter_base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.adapter_base import check_base, write_record

if TYPE_CHECKING:
    from peft import LoraConfig

# mdmkit's module names inside a DiffusionLM block: attention q, k, v, o; the MLP's gate, up, down
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTER = "default"  # peft's name of the one adapter
SAVED_PREFIX = "base_model.model."  # where peft's saved adapters name the model's modules


@dataclass(frozen=True)
class LoRA:
    """Adapters of rank `r` on the modules named `targets` of every block, scaled by `alpha / r`."""

    r: int
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def peft_config(self, base: str | None = None) -> LoraConfig:
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha,  # type: ignore[arg-type]  # peft annotates int; divides it
                          lora_dropout=self.dropout, target_modules=list(self.targets), bias="none",
                          base_model_name_or_path=base)


def add_lora(network: nn.Module, lora: LoRA) -> nn.Module:
    """`network` with LoRA adapters on its `lora.targets`, every other weight frozen (in place). The adapters are
    float32 whatever the base's dtype: small updates to bfloat16 weights would round away."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(lora.peft_config(), network)
    for name, parameter in network.named_parameters():
        adapter = ".lora_" in name
        parameter.requires_grad_(adapter)
        if adapter:
            parameter.data = parameter.data.float()
    return network


def _update(state: dict[str, torch.Tensor], name: str, scaling: float) -> torch.Tensor | None:
    """scaling * B @ A (float32) of the LoRA layer whose base weight is `name`, or None if it has none."""
    module = name.rsplit(".base_layer.", 1)[0]
    down, up = state.get(f"{module}.lora_A.{ADAPTER}.weight"), state.get(f"{module}.lora_B.{ADAPTER}.weight")
    if not name.endswith(".weight") or down is None or up is None:
        return None
    return scaling * (up.float() @ down.float())


def merged_weights(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A DiffusionLM state dict from one with LoRA layers under the plain names: each adapted weight W + scaling *
    B @ A in float32, whatever W's dtype (a small update merged into bfloat16 weights would round away), the other
    tensors as they are; a state dict without adapters comes back as it is."""
    merged = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            merged[name] = tensor
            continue
        delta = _update(state, name, scaling)
        merged[name.replace(".base_layer.", ".")] = tensor if delta is None else tensor.float() + delta
    return merged


@dataclass(frozen=True)
class Rounding:
    """What of an adapter's update a cast of the merged weights keeps, against the base cast alike (the model a
    lower-precision save is compared with). `changed`: weight entries the update changes in float32; `kept`: those
    still different from the base after the cast; `error`: the norm of the cast's update minus the true one, as a
    share of the true one's (0: kept exactly, 1: as if no adapter)."""

    dtype: torch.dtype
    changed: int
    kept: int
    error: float

    def describe(self) -> str:
        share = self.kept / self.changed if self.changed else 1.0
        name = str(self.dtype).removeprefix("torch.")
        return (f"in {name} the merged weights differ from the {name} base in {self.kept:,} of the {self.changed:,} "
                f"entries the adapter changed ({share:.1%}); the update they carry is off by {self.error:.1%} of "
                "its norm")


def rounding(state: dict[str, torch.Tensor], scaling: float, dtype: torch.dtype) -> Rounding:
    """How much of the LoRA update in `state` (a state dict with LoRA layers) survives casting the merged weights
    to `dtype`: one pass over the adapted weights, each tensor at a time."""
    changed = kept = 0
    missed = total = 0.0
    for name, tensor in state.items():
        delta = _update(state, name, scaling) if ".base_layer." in name else None
        if delta is None:
            continue
        base = tensor.float()
        merged = base + delta
        moved = merged != base
        cast_base = base.to(dtype)
        carried = merged.to(dtype).float() - cast_base.float()
        changed += int(moved.sum())
        kept += int((moved & (carried != 0)).sum())
        missed += float((carried - delta).square().sum())
        total += float(delta.square().sum())
    return Rounding(dtype, changed, kept, (missed / total) ** 0.5 if total else 0.0)


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a state dict under peft's saved names."""
    return {SAVED_PREFIX + name.replace(f".{ADAPTER}.", "."): tensor.detach().cpu().contiguous()
            for name, tensor in state.items() if ".lora_" in name}


def save_adapter(state: dict[str, torch.Tensor], lora: LoRA, directory: Path, base: str | None = None,
                 kind: str | None = None) -> Path:
    """Write the adapter alone, as `peft` writes it (`base`: the model it adapts, recorded in its config), and
    with `kind` (the base's model kind) the record of its base that `load_adapter` checks (`adapter_base`)."""
    from safetensors.torch import save_file

    weights = adapter_weights(state)
    if not weights:
        raise CheckpointError("no LoRA weights to save (sft.lora_r=0 trains every weight)")
    directory.mkdir(parents=True, exist_ok=True)
    lora.peft_config(base).save_pretrained(str(directory))
    save_file(weights, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    if kind is not None:
        write_record(directory, state, kind, base)
    return directory


def load_adapter(network: nn.Module, directory: str | Path, kind: str | None = None,
                 any_base: bool = False) -> nn.Module:
    """`network` (a DiffusionLM of model kind `kind`) with a saved adapter merged into its weights (in place). An
    adapter saved by mdmkit is refused on another kind or, unless `any_base`, on other weights than its base's."""
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors.torch import load_file

    directory = Path(directory).expanduser()
    files = [directory / "adapter_config.json", directory / "adapter_model.safetensors"]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        raise CheckpointError(f"{directory}: not a LoRA adapter (no {', '.join(missing)})")
    check_base(network.state_dict(), directory, kind, any_base)
    config = LoraConfig.from_pretrained(str(directory))
    if config.use_rslora or config.use_dora or config.rank_pattern or config.alpha_pattern:
        raise CheckpointError(f"{directory}: only plain LoRA adapters merge here (no rsLoRA, DoRA or per-module ranks)")
    loaded = {name.removeprefix(SAVED_PREFIX).replace(".lora_A.", f".lora_A.{ADAPTER}.")
              .replace(".lora_B.", f".lora_B.{ADAPTER}."): tensor for name, tensor in load_file(files[1]).items()}
    inject_adapter_in_model(config, network)
    state = network.state_dict()
    unknown = sorted(set(loaded) - set(state))
    if unknown:
        raise CheckpointError(f"{directory}: adapter weight {unknown[0]!r} fits no module of this network")
    absent = sorted(name for name in state if ".lora_" in name and name not in loaded)
    if absent:
        raise CheckpointError(f"{directory}: no weights for {absent[0]!r}, which the adapter's config names")
    misfit = next((name for name in sorted(loaded) if loaded[name].shape != state[name].shape), None)
    if misfit is not None:
        raise CheckpointError(f"{directory}: adapter weight {misfit!r} has shape {list(loaded[misfit].shape)}, this "
                              f"network's {list(state[misfit].shape)}: the adapter was made for a model of another "
                              "shape")
    state.update(loaded)
    plain = merged_weights(state, config.lora_alpha / config.r)
    _remove_lora(network)
    network.load_state_dict(plain)
    return network


def _remove_lora(network: nn.Module) -> None:
    """Put each LoRA layer's plain base layer back."""
    for name, module in list(network.named_modules()):
        base = getattr(module, "base_layer", None)
        if base is not None and name:
            parent, _, child = name.rpartition(".")
            setattr(network.get_submodule(parent) if parent else network, child, base)
    if hasattr(network, "peft_config"):
        del network.peft_config

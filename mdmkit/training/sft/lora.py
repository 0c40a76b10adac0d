"""LoRA on mdmkit's DiffusionLM through `peft`: adapters injected in place, merged into plain weights on save.

Merging works on a state dict, not on modules, so it runs the same on weights that FSDP gathered from its shards.
The adapter alone is written in peft's own format (adapter_config.json + adapter_model.safetensors, keys under
`base_model.model.`), which `peft.PeftModel.from_pretrained` and `load_adapter` below read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mdmkit.core.errors import CheckpointError
from mdmkit.training.sft.config import SFTConfig

ADAPTER = "default"  # peft's name of the one adapter
SAVED_PREFIX = "base_model.model."  # where peft's saved adapters name the model's modules


def lora_config(config: SFTConfig):  # -> peft.LoraConfig (peft is imported only when LoRA is used)
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_targets), bias="none", base_model_name_or_path=config.model)


def add_lora(network: nn.Module, config: SFTConfig) -> nn.Module:
    """`network` with LoRA adapters on its `lora_targets`, every other weight frozen (in place)."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(lora_config(config), network)
    for name, parameter in network.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    return network


def merged_weights(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A DiffusionLM state dict from one with LoRA layers: W + scaling * B @ A (in float32, cast back to W's dtype)
    under the plain names; a state dict without adapters comes back as it is."""
    merged = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            merged[name] = tensor
            continue
        plain = name.replace(".base_layer.", ".")
        module = name.rsplit(".base_layer.", 1)[0]
        down, up = state.get(f"{module}.lora_A.{ADAPTER}.weight"), state.get(f"{module}.lora_B.{ADAPTER}.weight")
        if name.endswith(".weight") and down is not None and up is not None:
            delta = scaling * (up.float() @ down.float())
            tensor = (tensor.float() + delta).to(tensor.dtype)
        merged[plain] = tensor
    return merged


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a state dict under peft's saved names."""
    return {SAVED_PREFIX + name.replace(f".{ADAPTER}.", "."): tensor.detach().cpu().contiguous()
            for name, tensor in state.items() if ".lora_" in name}


def save_adapter(state: dict[str, torch.Tensor], config: SFTConfig, directory: Path) -> Path:
    """Write the adapter alone, as `peft` writes it."""
    from safetensors.torch import save_file

    weights = adapter_weights(state)
    if not weights:
        raise CheckpointError("no LoRA weights to save (sft.lora_r=0 trains every weight)")
    directory.mkdir(parents=True, exist_ok=True)
    lora_config(config).save_pretrained(str(directory))
    save_file(weights, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


def load_adapter(network: nn.Module, directory: str | Path) -> nn.Module:
    """`network` (a DiffusionLM) with a saved adapter merged into its weights (in place)."""
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors.torch import load_file

    directory = Path(directory).expanduser()
    files = [directory / "adapter_config.json", directory / "adapter_model.safetensors"]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        raise CheckpointError(f"{directory}: not a LoRA adapter (no {', '.join(missing)})")
    config = LoraConfig.from_pretrained(str(directory))
    loaded = {name.removeprefix(SAVED_PREFIX).replace(".lora_A.", f".lora_A.{ADAPTER}.")
              .replace(".lora_B.", f".lora_B.{ADAPTER}."): tensor for name, tensor in load_file(files[1]).items()}
    inject_adapter_in_model(config, network)
    state = network.state_dict()
    unknown = sorted(set(loaded) - set(state))
    if unknown:
        raise CheckpointError(f"{directory}: adapter weight {unknown[0]!r} fits no module of this network")
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


def describe(config: SFTConfig) -> dict[str, object]:
    """How the weights were trained, for result rows and the banner."""
    if not config.lora:
        return {"method": "full"}
    return {"method": "lora", "r": config.lora_r, "alpha": config.lora_alpha, "targets": list(config.lora_targets)}


def adapter_summary(directory: Path) -> str:
    return json.dumps(json.loads((directory / "adapter_config.json").read_text()).get("target_modules"))

"""Which base model a LoRA adapter belongs to: recorded beside the adapter when mdmkit saves one, checked on merging.

An update B @ A means something only on the weights it was trained against, yet merged into any model of the same
shape it loads without complaint. So `save_adapter` writes `mdmkit_base.json` beside peft's files (peft reads only
its own): the base's kind, where it was loaded from, and a probe of its weights, a few entries of every tensor.
The probe is read back from the network the adapter is merged into, wherever that came from (a copy, a hub
snapshot, another dtype): file sizes or paths would refuse a faithful copy, and the weights are what matter.
Entries are compared exactly when both sides hold the same dtype, else to the coarser dtype's rounding. An adapter
without the record (made by peft elsewhere) merges unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mdmkit.core.errors import CheckpointError

RECORD = "mdmkit_base.json"
PROBES = 8  # entries read from each tensor, spread evenly over it


def _positions(numel: int) -> list[int]:
    return [(numel - 1) * i // (PROBES - 1) for i in range(PROBES)]


def weight_probe(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Name -> shape, dtype and a few entries of each tensor of a plain network's state dict."""
    probe = {}
    for name, tensor in sorted(state.items()):
        flat = tensor.detach().reshape(-1)
        values = flat[torch.tensor(_positions(flat.numel()), device=flat.device)].float().cpu().tolist()
        probe[name] = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                       "values": values}
    return probe


def base_weights(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The frozen base of a state dict with LoRA layers, under the plain names."""
    return {name.replace(".base_layer.", "."): tensor for name, tensor in state.items() if ".lora_" not in name}


def write_record(directory: Path, state: Mapping[str, torch.Tensor], kind: str, base: str | None) -> None:
    """Record the base of the adapter saved in `directory` (`state`: the trained network's, LoRA layers included)."""
    record = {"kind": kind, "base": base, "probe": weight_probe(base_weights(state))}
    (directory / RECORD).write_text(json.dumps(record) + "\n")


def read_record(directory: Path) -> dict[str, Any] | None:
    path = directory / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(record, dict) or not isinstance(record.get("probe"), dict):
        raise CheckpointError(f"{path}: not an adapter's base record (no probe)")
    return record


def _agrees(entry: Mapping[str, Any], tensor: torch.Tensor) -> bool:
    if list(tensor.shape) != entry["shape"]:
        return False
    recorded = torch.tensor(entry["values"], dtype=torch.float64)
    flat = tensor.detach().reshape(-1)
    found = flat[torch.tensor(_positions(flat.numel()), device=flat.device)].double().cpu()
    dtypes = {getattr(torch, entry["dtype"]), tensor.dtype}
    if len(dtypes) == 1:
        return bool(torch.equal(recorded, found))
    coarse = torch.finfo(max(dtypes, key=lambda dtype: torch.finfo(dtype).eps))
    return bool(torch.allclose(recorded, found, rtol=coarse.eps, atol=coarse.tiny * coarse.eps))


def check_base(network_state: Mapping[str, torch.Tensor], directory: Path, kind: str | None = None,
               any_base: bool = False) -> None:
    """Refuse, in one line, merging the adapter in `directory` into a network of another kind than its base's
    (`kind`: the network's, None: not checked) or, unless `any_base`, into other weights than its base's."""
    record = read_record(directory)
    if record is None:
        return
    trained_on = record.get("base") or "its base"
    if kind is not None and record.get("kind") not in (None, kind):
        raise CheckpointError(f"{directory}: an adapter of a {record['kind']} model ({trained_on}), not of this "
                              f"{kind} one: merge it into its base (hf.kind={record['kind']})")
    if any_base:
        return
    probe: dict[str, Any] = record["probe"]
    differing = [name for name, entry in probe.items()
                 if name not in network_state or not _agrees(entry, network_state[name])]
    if differing:
        raise CheckpointError(f"{directory}: trained on another base ({trained_on}): {len(differing)} of "
                              f"{len(probe)} of this model's tensors differ from it, e.g. {differing[0]} "
                              "(hf.adapter_any_base=true merges it anyway)")

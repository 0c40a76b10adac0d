"""Hub checkpoints (config.json and safetensors) read into mdmkit's `DiffusionLM`, without the models' remote code.

Each model kind's module (`kinds/`) gives its hub format (`hub_format.Architecture`): config.json to
`DiffusionLMConfig` fields, and tensor names to parameters. This module reads any of them: the network is built on
the meta device and filled one tensor at a time, so an 8B model is never materialised twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.models.llm.hub_format import Architecture, ConfigFields, Slot
from mdmkit.models.llm.moe import MoEConfig
from mdmkit.models.llm.registry import declared_kind, kind_names, model_kind


def architecture(kind: str) -> Architecture:
    """The hub format of `kind`, one of the kinds mdmkit's own network loads."""
    found = model_kind(kind, lambda k: k.architecture is not None, "the kinds with a native network").architecture
    assert found is not None
    return found


def read_config(directory: Path, kind: str, mask_id: int | None = None) -> DiffusionLMConfig:
    """The network config of the checkpoint in `directory`, read as a `kind` config.json; `mask_id` overrides the
    config's (Fast-dLLM v2 names its mask token only in its tokenizer)."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    reader = architecture(kind).read
    declared = declared_kind(raw)
    if declared is not None and declared.name != kind:
        raise CheckpointError(f"{path}: a {raw['model_type']} checkpoint (model_type), not {kind}: load it as "
                              f"kind {declared.name} (hf.kind={declared.name})")
    try:
        read = reader(ConfigFields(raw, path))
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
    return shapes[first.name] if first.expert is None else shapes[first.name][1:]


def _place(state: dict[str, torch.Tensor], slots: list[Slot], tensor: torch.Tensor,
           shapes: dict[str, tuple[int, ...]]) -> None:
    for slot in slots:
        part = tensor if slot.rows is None else tensor[slot.rows[0]: slot.rows[1]].contiguous()
        if slot.expert is None:
            state[slot.name] = part
            continue
        if slot.name not in state:  # a stacked parameter, filled one expert at a time
            state[slot.name] = tensor.new_empty(shapes[slot.name])
        state[slot.name][slot.expert] = part


def load_diffusion_lm(directory: str | Path, kind: str, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu", mask_id: int | None = None) -> DiffusionLM:
    """The checkpoint in `directory`, read as `kind`, as a `DiffusionLM` in eval mode; `mask_id` as `read_config`'s."""
    from safetensors import SafetensorError, safe_open

    native = kind_names(lambda k: k.architecture is not None)
    if kind not in native:
        raise CheckpointError(f"kind='{kind}' has no native network (one of {', '.join(native)})")
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise CheckpointError(f"no model directory at {directory}")
    config = read_config(directory, kind, mask_id)
    layout = architecture(kind)
    names = layout.names(config)
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
                        tied_head = config.tie_embeddings and name in (layout.head, "lm_head.weight")
                        if name.endswith("rotary_emb.inv_freq") or tied_head:
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

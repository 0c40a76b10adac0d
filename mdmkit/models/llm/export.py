"""mdmkit's `DiffusionLM` saved as a Hugging Face hub checkpoint directory (the kinds whose record says `export`).

The files are the hub's: the original tensor names and shapes (the kind's `hub_format.Architecture`), in
`model.safetensors` or shards with their index, beside the source checkpoint's config.json, tokenizer files and
remote code. So a fine-tuned or edited network loads back through `load_diffusion_lm` / `hf.load_native`, and
through the models' own official code, unchanged. The config is never invented: only the source's is written, with
its `torch_dtype` updated. Weights are written under temporary names and put in place last, the single file or the
index last of all, so a crash mid-save never leaves a directory that loads as a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.checkpoints import architecture
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.registry import kind_names

INDEX = "model.safetensors.index.json"
# tokenizer files, generation settings and remote code the official loaders read beside the weights
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json")
SIDE_PATTERNS = ("*.model", "*.tiktoken", "*.py")


def _tensors(network: DiffusionLM, kind: str, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Hub name -> the network's tensor on the CPU, in `dtype` (default: its own), contiguous."""
    state = network.state_dict()
    tensors = {}
    for hub, own in architecture(kind).names(network.config).items():
        if not isinstance(own, str):  # an expert's slot or fused rows: a layout the save does not reassemble
            raise CheckpointError(f"kind='{kind}': tensor '{hub}' fills {own!r}, which saving does not support")
        tensors[hub] = state[own].detach().to("cpu", dtype or state[own].dtype).contiguous()
    return tensors


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """The names in order, a new shard whenever the next tensor would pass `max_bytes` (as the hub splits)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _copy_side_files(source: Path, directory: Path) -> None:
    if source.resolve() == directory.resolve():
        return
    files = [source / name for name in SIDE_FILES] + [f for p in SIDE_PATTERNS for f in source.glob(p)]
    for file in files:
        if file.is_file():
            shutil.copy(file, directory / file.name)


def save_hub_checkpoint(network: DiffusionLM, directory: str | Path, kind: str, source: str | Path | None = None,
                        dtype: torch.dtype | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Save `network` in `directory` as a `kind` hub checkpoint, with the config.json, tokenizer and remote code
    of `source` (the directory it was loaded from: the official code needs the original config's every field).
    `dtype` casts the weights (config.json's `torch_dtype` follows); above `max_shard_bytes` they are sharded."""
    from safetensors.torch import save_file

    exportable = kind_names(lambda k: k.export)
    if kind not in exportable:
        native = kind in kind_names(lambda k: k.architecture is not None)
        reason = "saving its hub layout is not supported yet" if native else "it cannot be saved as a hub checkpoint"
        raise CheckpointError(f"kind='{kind}': {reason} (only {', '.join(exportable)})")
    source = None if source is None else Path(source).expanduser()
    if source is None or not (source / "config.json").is_file():
        raise CheckpointError(f"saving a {kind} hub checkpoint needs the source directory's config.json (got "
                              f"source={source}): mdmkit does not invent hub configs")
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{source / 'config.json'}: not readable JSON ({error})") from None
    tensors = _tensors(network, kind, dtype)
    saved = dtype or next(iter(tensors.values())).dtype
    config["torch_dtype"] = str(saved).removeprefix("torch.")

    directory = Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    _copy_side_files(source, directory)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    shards = _shards(tensors, max_shard_bytes)
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    temporary = {file: directory / f".{file}.tmp" for file in [*files, INDEX]}
    try:
        for file, names in zip(files, shards):
            save_file({name: tensors[name] for name in names}, str(temporary[file]), metadata={"format": "pt"})
        if len(shards) > 1:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            weight_map = {name: file for file, names in zip(files, shards) for name in names}
            temporary[INDEX].write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=2) + "\n")
        # old weights go only now (a smaller re-save must leave no stale shard); the index or single file last
        for old in [directory / INDEX, *directory.glob("model*.safetensors")]:
            old.unlink(missing_ok=True)
        for file in files + ([INDEX] if len(shards) > 1 else []):
            os.replace(temporary[file], directory / file)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return directory

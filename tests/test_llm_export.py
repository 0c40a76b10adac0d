"""`save_hub_checkpoint`: mdmkit's LLaDA / Dream / Fast-dLLM v2 network saved in the hub's layout and read back.

The fixtures (`../shared/reference_models`, or `$MDMKIT_REFERENCE_MODELS`) are tiny random checkpoints in the
hub's exact format. The networks are perturbed before saving, so a round trip proves the saved weights are the
network's and not the fixture's.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_text_models import MASK_TOKEN, native_checkpoint_dir

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.checkpoints import load_diffusion_lm
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.export import save_hub_checkpoint
from mdmkit.models.llm.hf import load_native

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
pytestmark = [
    pytest.mark.skipif(not all((REFERENCE / kind / "model.safetensors").is_file() for kind in
                               ("llada", "dream", "fast_dllm_v2")),
                       reason=f"reference model fixtures not found: {REFERENCE}"),
    pytest.mark.usefixtures("one_thread"),
]
KINDS = ["llada", "dream", "fast_dllm_v2"]
MASK_ID = {"fast_dllm_v2": 1023}  # Fast-dLLM v2's config names no mask token (its tokenizer does)


def load(directory: Path, kind: str, dtype: torch.dtype = torch.float32) -> DiffusionLM:
    return load_diffusion_lm(directory, kind, dtype=dtype, mask_id=MASK_ID.get(kind))


@torch.no_grad()
def perturbed(kind: str, seed: int = 0) -> DiffusionLM:
    """The fixture's network with 0.01 * a seeded normal added to every parameter."""
    network = load(REFERENCE / kind, kind)
    generator = torch.Generator().manual_seed(seed)
    for parameter in network.parameters():
        parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
    return network


@torch.no_grad()
def logits(network: DiffusionLM, kind: str) -> torch.Tensor:
    return network(load_file(REFERENCE / kind / "expected.safetensors")["input_ids"])


def shapes(file: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(file), framework="pt") as handle:
        return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118


def weight_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(("model", ".model")))


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_gives_the_networks_logits(kind: str, tmp_path: Path) -> None:
    network = perturbed(kind)
    saved = save_hub_checkpoint(network, tmp_path / "a" / "b", kind, source=REFERENCE / kind)
    assert saved == tmp_path / "a" / "b" and weight_files(saved) == ["model.safetensors"]
    expected = logits(network, kind)
    assert not torch.equal(expected, logits(load(REFERENCE / kind, kind), kind))  # the perturbation shows
    assert torch.equal(logits(load(saved, kind), kind), expected)
    config, original = (json.loads((d / "config.json").read_text()) for d in (saved, REFERENCE / kind))
    assert config == {**original, "torch_dtype": "float32"}
    assert (saved / "generation_config.json").read_bytes() == (REFERENCE / kind / "generation_config.json").read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_names_and_shapes_are_the_hubs(kind: str, tmp_path: Path) -> None:
    saved = save_hub_checkpoint(perturbed(kind), tmp_path, kind, source=REFERENCE / kind)
    assert shapes(saved / "model.safetensors") == shapes(REFERENCE / kind / "model.safetensors")
    with safe_open(str(saved / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_save_has_an_index_covering_every_tensor(kind: str, tmp_path: Path) -> None:
    network = perturbed(kind)
    tensors = load_file(REFERENCE / kind / "model.safetensors")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    saved = save_hub_checkpoint(network, tmp_path, kind, source=REFERENCE / kind, max_shard_bytes=total // 4)
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 4 and files == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                         for i in range(1, len(files) + 1)]
    assert weight_files(saved) == sorted([*files, "model.safetensors.index.json"])  # no single file, no temporaries
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(tensors)
    for file in files:
        stored = shapes(saved / file)
        assert sum(torch.Size(s).numel() * 4 for s in stored.values()) <= total // 4 or len(stored) == 1
        assert {name for name, f in index["weight_map"].items() if f == file} == set(stored)
    assert torch.equal(logits(load(saved, kind), kind), logits(network, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_save(kind: str, tmp_path: Path) -> None:
    network = perturbed(kind)
    saved = save_hub_checkpoint(network, tmp_path, kind, source=REFERENCE / kind, dtype=torch.bfloat16)
    assert json.loads((saved / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(saved / "model.safetensors").values()} == {torch.bfloat16}
    rounded = copy.deepcopy(network).to(torch.bfloat16).float()
    expected = logits(rounded, kind)
    assert not torch.equal(expected, logits(network, kind))
    assert torch.equal(logits(load(saved, kind, torch.float32), kind), expected)


def test_unsupported_kinds_and_a_missing_source_config_are_refused(tmp_path: Path) -> None:
    network = perturbed("llada")
    with pytest.raises(CheckpointError, match="kind='llada_moe': saving its hub layout is not supported yet"):
        save_hub_checkpoint(network, tmp_path / "moe", "llada_moe", source=REFERENCE / "llada")
    with pytest.raises(CheckpointError, match="kind='gpt2'.*only dream, fast_dllm_v2, llada"):
        save_hub_checkpoint(network, tmp_path / "gpt2", "gpt2", source=REFERENCE / "llada")
    with pytest.raises(CheckpointError, match="needs the source directory's config.json"):
        save_hub_checkpoint(network, tmp_path / "none", "llada")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="needs the source directory's config.json"):
        save_hub_checkpoint(network, tmp_path / "out", "llada", source=tmp_path / "empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing written on a refusal


def test_resaving_with_fewer_shards_leaves_no_stale_files(tmp_path: Path) -> None:
    network = perturbed("dream")
    save_hub_checkpoint(network, tmp_path, "dream", source=REFERENCE / "dream", max_shard_bytes=1)
    many = weight_files(tmp_path)
    assert len(many) > 5 and "model-00005-of-" in many[4]
    (tmp_path / "model-00099-of-00099.safetensors").write_bytes(b"stale")
    save_hub_checkpoint(network, tmp_path, "dream", source=REFERENCE / "dream", max_shard_bytes=2**40)
    assert weight_files(tmp_path) == ["model.safetensors"]
    assert torch.equal(logits(load(tmp_path, "dream"), "dream"), logits(network, "dream"))


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    before = perturbed("llada", seed=1)
    save_hub_checkpoint(before, tmp_path, "llada", source=REFERENCE / "llada", max_shard_bytes=2**40)
    calls = []
    real = safetensors.torch.save_file

    def failing(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", failing)
    with pytest.raises(OSError, match="disk full"):
        save_hub_checkpoint(perturbed("llada", seed=2), tmp_path, "llada", source=REFERENCE / "llada",
                            max_shard_bytes=1)
    assert len(calls) == 2 and weight_files(tmp_path) == ["model.safetensors"]  # temporaries removed
    assert torch.equal(logits(load(tmp_path, "llada"), "llada"), logits(before, "llada"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_checkpoint_keeps_its_tokenizer_and_loads_natively(kind: str, tmp_path: Path) -> None:
    user = native_checkpoint_dir(REFERENCE / kind, kind, tmp_path / "user")
    (user / "modeling_tiny.py").write_text("# remote code the official loader imports\n")
    network, tokenizer = load_native(str(user), kind)
    with torch.no_grad():
        network.norm.weight.add_(0.5)
    saved = save_hub_checkpoint(network, tmp_path / "saved", kind, source=user)
    copied = sorted(p.name for p in user.iterdir() if p.name not in ("config.json", "model.safetensors"))
    assert "tokenizer.json" in copied and "modeling_tiny.py" in copied
    for name in copied:
        assert (saved / name).read_bytes() == (user / name).read_bytes(), name
    again, tokenizer_again = load_native(str(saved), kind)
    text = "def add(a, b): return a + b"
    assert tokenizer_again(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tokenizer_again.mask_token_id == tokenizer.mask_token_id and again.mask_id == network.mask_id == 1023
    assert tokenizer_again.convert_ids_to_tokens(1023) == tokenizer.convert_ids_to_tokens(1023) == MASK_TOKEN[kind]
    assert torch.equal(logits(again, kind), logits(network, kind))

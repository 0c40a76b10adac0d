"""What a LoRA run saves, on the tiny example models (no reference fixtures needed): the merged model equals base +
adapter in float32, a lower-precision save reports what of the adapter it lost, and a saved adapter knows its base
(kind and weights), so merging it into another model is one line, while an adapter peft made still merges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.adapter_base import RECORD
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.lora import LoRA, add_lora, load_adapter, merged_weights, rounding, save_adapter
from mdmkit.models.llm.tiny import make_tiny_model
from mdmkit.training.sft.config import SFTConfig
from mdmkit.training.sft.train import plain_network

pytest.importorskip("peft")
LORA = LoRA(r=4, targets=("q", "k", "v", "up", "down"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {"llada": make_tiny_model("llada", root / "llada"), "dream": make_tiny_model("dream", root / "dream"),
            "llada_seed1": make_tiny_model("llada", root / "llada_seed1", seed=1)}


def trained(directory: Path, kind: str, dtype: str = "float32", seed: int = 0) -> torch.nn.Module:
    """The model with LoRA adapters as training leaves them (peft starts B at zero: merged = base, trivially)."""
    network = add_lora(load_native(str(directory), kind, dtype=dtype)[0], LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if ".lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return network


def save(network: torch.nn.Module, directory: Path, base: Path, kind: str) -> Path:
    return save_adapter(network.state_dict(), LORA, directory, base=str(base), kind=kind)


# -- exact saves ---------------------------------------------------------------------------------------------------

def test_the_merged_model_is_base_plus_adapter_in_float32_on_a_bfloat16_base(models) -> None:
    network = trained(models["llada"], "llada", dtype="bfloat16")
    state = network.state_dict()
    sft = SFTConfig(model=str(models["llada"]), lora_r=LORA.r, lora_targets=LORA.targets, dtype="bfloat16")
    merged = plain_network(dict(state), network.config, sft).state_dict()
    assert {tensor.dtype for tensor in merged.values()} == {torch.float32}
    module = "blocks.0.attn.q"
    expected = state[f"{module}.base_layer.weight"].float() + LORA.scaling * (
        state[f"{module}.lora_B.default.weight"] @ state[f"{module}.lora_A.default.weight"])
    assert (merged[f"{module}.weight"] - expected).abs().max() <= 1e-6
    assert torch.equal(merged["blocks.0.attn.o.weight"], state["blocks.0.attn.o.weight"].float())  # not adapted


def test_rounding_counts_what_a_cast_keeps_of_the_update() -> None:
    ones = torch.ones(2, 3, dtype=torch.bfloat16)  # bfloat16's spacing at 1 is 2**-7
    state = {"m.base_layer.weight": ones, "m.lora_A.default.weight": torch.ones(1, 3),
             "m.lora_B.default.weight": torch.full((2, 1), 2.0 ** -10)}  # an update of 2**-10 to each entry
    lost = rounding(state, 1.0, torch.bfloat16)
    assert (lost.changed, lost.kept, lost.error) == (6, 0, 1.0)  # all of it rounds away
    assert "in 0 of the 6 entries the adapter changed (0.0%)" in lost.describe()
    state["m.lora_B.default.weight"] = torch.full((2, 1), 0.5)  # 1.5: exact in bfloat16
    assert rounding(state, 1.0, torch.bfloat16) == type(lost)(torch.bfloat16, 6, 6, 0.0)
    exact = merged_weights(state, 1.0)["m.weight"]
    assert exact.dtype == torch.float32 and torch.equal(exact, torch.full((2, 3), 1.5))


def test_a_bfloat16_copy_of_a_trained_model_loses_most_of_a_small_adapter(models) -> None:
    network = trained(models["llada"], "llada")
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if ".lora_B" in name:
                parameter.mul_(1e-3)  # an update far below the weights, as a short run leaves it
    lost = rounding(network.state_dict(), LORA.scaling, torch.bfloat16)
    assert lost.changed > 0 and lost.kept < lost.changed / 2 and lost.error > 0.5


# -- the adapter's base --------------------------------------------------------------------------------------------

def test_an_adapter_records_its_base_and_merges_into_it(models, tmp_path: Path) -> None:
    network = trained(models["llada"], "llada")
    directory = save(network, tmp_path / "adapter", models["llada"], "llada")
    record = json.loads((directory / RECORD).read_text())
    assert record["kind"] == "llada" and record["base"] == str(models["llada"])
    assert "blocks.0.attn.q.weight" in record["probe"] and not any(".lora_" in name for name in record["probe"])
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        expected = network(tokens)
        for dtype in ("float32", "bfloat16"):  # the base as loaded in another dtype is the same base
            merged = load_adapter(load_native(str(models["llada"]), "llada", dtype=dtype)[0], directory, "llada")
            assert merged.embed.weight.dtype == getattr(torch, dtype)
        merged = load_adapter(load_native(str(models["llada"]), "llada")[0], directory, "llada")
        assert (merged(tokens) - expected).abs().max() < 1e-5
    copy = tmp_path / "copy"  # a copy of the base elsewhere, with a file more, is the same base
    shutil.copytree(models["llada"], copy)
    (copy / "README.md").write_text("notes\n")
    load_adapter(load_native(str(copy), "llada")[0], directory, "llada")


def test_an_adapter_trained_on_a_bfloat16_base_merges_into_the_float32_one(models, tmp_path: Path) -> None:
    directory = save(trained(models["llada"], "llada", dtype="bfloat16"), tmp_path / "adapter", models["llada"],
                     "llada")
    load_adapter(load_native(str(models["llada"]), "llada")[0], directory, "llada")


def test_an_adapter_on_another_kind_or_base_is_one_line(models, tmp_path: Path) -> None:
    dream = save(trained(models["dream"], "dream"), tmp_path / "dream", models["dream"], "dream")
    with pytest.raises(CheckpointError, match=r"an adapter of a dream model .*, not of this llada one"):
        load_adapter(load_native(str(models["llada"]), "llada")[0], dream, "llada")
    llada = save(trained(models["llada"], "llada"), tmp_path / "llada", models["llada"], "llada")
    with pytest.raises(CheckpointError, match=r"trained on another base .*: 30 of 39 of this model.s tensors differ"
                                              r".*hf.adapter_any_base=true merges it anyway"):
        load_adapter(load_native(str(models["llada_seed1"]), "llada")[0], llada, "llada")
    other = load_adapter(load_native(str(models["llada_seed1"]), "llada")[0], llada, "llada", any_base=True)
    assert set(other.state_dict()) == set(load_native(str(models["llada"]), "llada")[0].state_dict())


def test_an_adapter_without_the_record_merges_and_a_misfit_is_one_line(models, tmp_path: Path) -> None:
    """As peft writes one: merged unchecked; on a model of another shape, one line instead of a size traceback."""
    dream = save(trained(models["dream"], "dream"), tmp_path / "dream", models["dream"], "dream")
    (dream / RECORD).unlink()
    load_adapter(load_native(str(models["dream"]), "dream")[0], dream, "dream")
    with pytest.raises(CheckpointError, match=r"adapter weight '.*' has shape \[.*\], this network's \[.*\]: the "
                                              "adapter was made for a model of another shape"):
        load_adapter(load_native(str(models["llada"]), "llada")[0], dream, "llada")


def test_evaluate_refuses_a_dream_adapter_on_a_llada_base_in_one_line(models, tmp_path: Path) -> None:
    dream = save(trained(models["dream"], "dream"), tmp_path / "dream", models["dream"], "dream")
    out = run_cli("evaluate.py", "task=gsm8k", f"task.data_dir={ROOT / 'examples/arithmetic'}",
                  f"ckpt={models['llada']}", "hf.kind=llada", f"hf.adapter={dream}", "limit=1",
                  f"results_file={tmp_path}/rows.jsonl", cwd=tmp_path)
    # refused by the plan, before the model loads, from the kind the adapter's record names
    assert out.returncode != 0 and "was trained on a dream model" in out.stderr and "not a llada one" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr[-3000:]

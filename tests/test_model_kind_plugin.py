"""A model kind added from outside the package (tests/plugins/toy_kind.py, one module and one registration) runs
everywhere a built-in kind does: loading, evaluate.py, the lm-eval model, a LoRA fine-tuning step and its save.

The toy kind stores the LLaDA reference fixture's weights under a format of its own, so every result must equal
the LLaDA kind's on the same weights. The subprocesses find the kind through its entry point only (the plugin
directory on PYTHONPATH; nothing imports it first)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import BENCHMARK_DATA, ROOT, run_cli
from tiny_text_models import native_checkpoint_dir

from mdmkit.core.errors import CheckpointError
from mdmkit.models.llm.checkpoints import load_diffusion_lm
from mdmkit.models.llm.export import save_hub_checkpoint
from mdmkit.models.llm.registry import kind_names, load_model

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
PLUGINS = Path(__file__).parent / "plugins"
pytestmark = [
    pytest.mark.skipif(not (REFERENCE / "llada").is_dir(), reason=f"no LLaDA reference fixture at {REFERENCE}"),
    pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(), reason=f"no GSM8K at {BENCHMARK_DATA}"),
    pytest.mark.usefixtures("one_thread"),
]
WEIGHTS = ("config.json", "model.safetensors", "generation_config.json")


@pytest.fixture(scope="module")
def toy_kind():
    """The plugin, imported as a user's package would be (its import registers the kind)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PLUGINS))
        import toy_kind

        yield toy_kind


@pytest.fixture(scope="module")
def checkpoints(toy_kind, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The LLaDA fixture as a user's directory, and the same weights and tokenizer saved as a toy checkpoint."""
    root = tmp_path_factory.mktemp("kinds")
    llada = native_checkpoint_dir(REFERENCE / "llada", "llada", root / "llada")
    toy = root / "toy"
    toy.mkdir()
    for file in llada.iterdir():
        if file.name not in WEIGHTS:
            shutil.copy(file, toy / file.name)
    config = load_diffusion_lm(llada, "llada").config
    (toy / "config.json").write_text(json.dumps({
        "model_type": toy_kind.MODEL_TYPE, "vocab": config.vocab_size, "width": config.d_model,
        "depth": config.n_layers, "heads": config.n_heads, "hidden": config.mlp_hidden, "mask_token_id": config.mask_id,
        "theta": config.rope_theta, "eps": config.rms_eps, "positions": config.max_positions}))
    save_hub_checkpoint(load_diffusion_lm(llada, "llada"), toy, "toy", source=toy)
    return {"llada": llada, "toy": toy}


def test_the_kind_loads_the_same_network_and_is_told_apart_from_llada(checkpoints) -> None:
    assert "toy" in kind_names() and "toy" in kind_names(lambda kind: kind.lora and kind.export)
    (toy, _), (llada, _) = load_model(str(checkpoints["toy"]), "toy"), load_model(str(checkpoints["llada"]), "llada")
    tokens = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(toy(tokens), llada(tokens))
    with pytest.raises(CheckpointError, match="a toy_mdm checkpoint \\(model_type\\), not llada: .*hf.kind=toy"):
        load_model(str(checkpoints["toy"]), "llada")


def test_evaluate_py_finds_the_kind_through_its_entry_point(checkpoints, tmp_path: Path) -> None:
    rows = {}
    for kind in ("toy", "llada"):
        results = tmp_path / f"{kind}.jsonl"
        done = run_cli("evaluate.py", "task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0",
                       "task.max_gen_len=16", f"ckpt={checkpoints[kind]}", f"hf.kind={kind}", "limit=2",
                       "batch_size=2", "device=cpu", "sampler=eb", "sampler.block_length=8",
                       f"results_file={results}", "wandb.mode=disabled", cwd=tmp_path, env={"PYTHONPATH": str(PLUGINS)})
        assert done.returncode == 0, done.stderr[-2000:]
        (rows[kind],) = [json.loads(line) for line in results.read_text().splitlines()]
    assert rows["toy"]["nfe_mean"] == rows["llada"]["nfe_mean"] and rows["toy"]["accuracy"] == rows["llada"]["accuracy"]


def test_the_lm_eval_model_generates_with_the_kind(checkpoints) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from mdmkit.evaluation.lm_eval_model import MdmkitLM

    request = Instance("generate_until", {}, ("Question: 2 + 3 = ?\nAnswer:", {"until": [], "max_gen_toks": 8}), 0)
    made = {kind: MdmkitLM(ckpt=str(checkpoints[kind]), kind=kind, sampler="eb", block_length=8, device="cpu",
                           batch_size=1).generate_until([request], disable_tqdm=True)[0] for kind in ("toy", "llada")}
    assert made["toy"] == made["llada"] and made["toy"].nfe == made["llada"].nfe >= 1


def test_a_lora_fine_tuning_step_trains_saves_and_reloads_the_kind(checkpoints, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a} + {a} =", "response": f"{2 * a}"}) + "\n" for a in range(12)))
    done = run_cli("train.py", "experiment=llada_sft", "sft.kind=toy", f"sft.model={checkpoints['toy']}",
                   f"sft.train_file={pairs}", "sft.max_length=64", "sft.lora_r=4", "trainer=cpu",
                   "trainer.precision=32-true", "trainer.max_steps=2", "trainer.val_check_interval=2", "logger=csv",
                   "trainer.enable_progress_bar=false", "data.batch_size=2", "data.eval_batch_size=2",
                   "data.val_examples=4", "optim.warmup_steps=0", "optim.lr=0.01", "evaluate_after_training=false",
                   "save_dtype=float32", f"results_file={tmp_path}/rows.jsonl", cwd=tmp_path,
                   env={"PYTHONPATH": str(PLUGINS)})
    assert done.returncode == 0, done.stderr[-3000:]
    run = next((tmp_path / "outputs" / "llada_sft").iterdir())
    assert (run / "adapter").is_dir()
    trained, _ = load_model(str(run / "model"), "toy")
    base, _ = load_model(str(checkpoints["toy"]), "toy")
    assert json.loads((run / "model" / "config.json").read_text())["model_type"] == "toy_mdm"
    tokens = torch.arange(24)[None]
    with torch.no_grad():
        assert (trained(tokens) - base(tokens)).abs().max() > 1e-4  # the step changed the weights it saved

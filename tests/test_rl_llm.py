"""A LoRA RL step on the tiny LLaDA and Dream models (random weights, the real tokenizer layout): rollouts of
GSM8K-format prompts (of two lengths: left padding) by a cached sampler, rewards, one policy update that moves the
adapters and leaves the base as it was. The tiny models say nothing about accuracy; the point is that every piece
runs on the native networks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ROOT

pytest.importorskip("peft")

from mdmkit.evaluation.generation import TextModel
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.lora import LoRA, add_lora
from mdmkit.models.llm.tiny import make_tiny_model
from mdmkit.objectives.rl import CoupledEstimator, GRPOLoss, OneStepEstimator
from mdmkit.samplers import TopKSampler
from mdmkit.tasks.gsm8k import GSM8KTask
from mdmkit.training.rl.config import RLConfig
from mdmkit.training.rl.rewards import Reward, Task, Verified
from mdmkit.training.rl.rollout import Rollouts
from mdmkit.training.rl.step import inner_loss, prepare
from mdmkit.training.rl.text_rollout import roll_out_text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-rl")
    return {kind: make_tiny_model(kind, root / kind) for kind in ("llada", "dream")}


@dataclass
class Parity(Reward):
    """A reward random texts vary in (their length's parity): the tiny models solve nothing."""

    def score(self, rollouts: Rollouts, task: Task) -> torch.Tensor | Sequence[float]:
        return [float(len(text) % 2) for text in rollouts.text(None)]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("kind", "estimator"), [("llada", OneStepEstimator()), ("dream", CoupledEstimator())])
def test_a_lora_rl_step_on_a_tiny_native_model(tiny: dict[str, Path], kind: str, estimator: object) -> None:
    network, tokenizer = load_native(str(tiny[kind]), kind)
    base = {name: tensor.clone() for name, tensor in network.state_dict().items()}
    network = add_lora(network, LoRA(r=4))
    model = TextModel(network, tokenizer, network.config.max_positions)
    task = GSM8KTask(data_dir=str(ROOT / "examples" / "arithmetic"), shots=0, chat=True, max_gen_len=16)
    docs = [task.docs("train")[0], {"question": "What is 12 + 30 - 4 + 1?", "answer": "12 + 30 = 42. 42 - 4 = 38. "
                                                                         "38 + 1 = 39.\n#### 39"}]
    sampler = TopKSampler(k=2, temperature=1.0, block_length=8, cache="dual")
    settings = RLConfig(group_size=4, sampler=sampler, estimator=estimator, loss=GRPOLoss(beta=0.0),  # type: ignore[arg-type]
                        rewards={"verified": Verified(), "parity": Parity()})
    rollouts = roll_out_text(model, sampler, task, docs, settings.group_size, torch.Generator().manual_seed(0))
    assert len(rollouts.texts or []) == 8 and rollouts.docs is not None and rollouts.docs[4] == docs[1]
    assert (rollouts.nfe <= 8).all() and (rollouts.nfe >= 1).all()  # two tokens a forward: at most 8 forwards
    assert rollouts.completion.any(1).all() and rollouts.finished.all()
    assert rollouts.attention is not None and not rollouts.attention[0].all()  # the shorter prompt is left-padded
    experience = prepare(network, None, settings, task, rollouts, seed=0)
    assert experience.rewards.parts["verified"].sum() == 0 and experience.advantages.abs().sum() > 0
    loss, _ = inner_loss(network, settings, experience, 0, rollouts.mask_id)
    optimizer = torch.optim.AdamW([p for p in network.parameters() if p.requires_grad], lr=1e-2)
    loss.backward()
    optimizer.step()
    adapters = {name: p for name, p in network.named_parameters() if ".lora_B" in name}
    assert adapters and any(p.abs().sum() > 0 for p in adapters.values())  # B starts at 0: the update moved it
    after = network.state_dict()
    for name, tensor in base.items():
        module, _, leaf = name.rpartition(".")
        adapted = f"{module}.base_layer.{leaf}"
        assert torch.equal(after[adapted if adapted in after else name], tensor), name


@pytest.mark.usefixtures("one_thread")
def test_train_py_experiment_llada_rl_on_the_tiny_model(tiny: dict[str, Path], tmp_path: Path) -> None:
    """The command docs/rl.md gives for LLaDA-8B, on the tiny LLaDA: rollouts, rewards, LoRA updates, model/ and
    adapter/ saved, GSM8K-format test problems evaluated, one row of kind rl."""
    from conftest import compose_config

    from mdmkit.training.preflight import plan_training
    from mdmkit.training.rl.plan import TextRLParts
    from mdmkit.training.rl.train import run_rl_training

    cfg = compose_config("train", [
        "experiment=llada_rl", f"sft.model={tiny['llada']}", "sft.lora_r=4",
        f"task.data_dir={ROOT}/examples/arithmetic", "task.max_gen_len=16", "sampler.block_length=8",
        "sampler.steps=4", "rl.sampler.block_length=8", "rl.sampler.steps=4", "rl.group_size=2", "trainer=cpu",
        "trainer.max_steps=2", "logger=csv", "eval_limit=4", "trainer.enable_progress_bar=false",
        f"results_file={tmp_path}/results.jsonl"])
    plan = plan_training(cfg)
    assert plan.kind == "rl" and isinstance(plan.parts, TextRLParts)
    summary = run_rl_training(plan, tmp_path)
    assert summary["global_step"] == 2 and "accuracy" in summary
    assert (tmp_path / "model" / "config.json").is_file() and (tmp_path / "adapter").is_dir()
    assert '"kind": "rl"' in (tmp_path / "results.jsonl").read_text()


def test_the_reference_under_lora_is_the_base_with_its_adapters_off(tiny: dict[str, Path]) -> None:
    from mdmkit.training.rl.text_module import BaseOf

    base, _ = load_native(str(tiny["llada"]), "llada")
    network = add_lora(load_native(str(tiny["llada"]), "llada")[0], LoRA(r=4))
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if ".lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(BaseOf(network)(tokens), base(tokens), atol=1e-5)
        assert not torch.allclose(network(tokens), base(tokens), atol=1e-3)  # the adapters are back on after


@pytest.mark.usefixtures("one_thread")
def test_a_text_rl_run_resumed_between_two_inner_updates_ends_where_an_uninterrupted_one_does(
        tiny: dict[str, Path], tmp_path: Path) -> None:
    """mu = 2 on the tiny LLaDA under LoRA, rewarded for texts of even length (random texts vary in it; the tiny
    model solves nothing): three steps, then the fourth from last.ckpt (the second inner update on step 3's
    rollouts, which the checkpoint kept: texts, documents, padding) give the adapters four steps give."""
    from conftest import compose_config
    from safetensors.torch import load_file

    from mdmkit.training.preflight import plan_training
    from mdmkit.training.rl.train import run_rl_training

    def run(directory: Path, *overrides: str) -> dict[str, torch.Tensor]:
        cfg = compose_config("train", [
            "experiment=llada_rl", f"sft.model={tiny['llada']}", "sft.lora_r=4",
            f"task.data_dir={ROOT}/examples/arithmetic", "task.max_gen_len=8", "sampler.block_length=8",
            "sampler.steps=4", "rl.sampler.block_length=8", "rl.sampler.steps=4", "rl.group_size=4",
            "~rl.rewards.verified", "+reward@rl.rewards.even=format", "rl.rewards.even.pattern='^(..)*$'",
            "rl.inner_updates=2", "data.batch_size=1", "trainer=cpu", "logger=csv", "evaluate_after_training=false",
            "trainer.enable_progress_bar=false", f"results_file={directory}/results.jsonl", *overrides])
        run_rl_training(plan_training(cfg), directory)
        return load_file(str(next((directory / "adapter").glob("*.safetensors"))))

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    run(tmp_path / "a", "trainer.max_steps=3")
    resumed = run(tmp_path / "a", "trainer.max_steps=4", f"ckpt_path={tmp_path}/a/checkpoints/last.ckpt")
    straight = run(tmp_path / "b", "trainer.max_steps=4")
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert any(value.abs().sum() > 0 for key, value in straight.items() if "lora_B" in key)  # the adapters trained

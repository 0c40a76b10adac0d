"""`train.py experiment=<task>_rl`: RL on an MDM run's machinery (data stream, checkpoints, resume, evaluation), or
on a fine-tuning run's (experiment=llada_rl / dream_rl: a pretrained diffusion LLM, LoRA, the hub-layout save)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mdmkit.training.preflight import TrainingPlan
from mdmkit.training.rl.module import RLModule
from mdmkit.training.rl.plan import TextRLParts
from mdmkit.training.train import run_training


def run_rl_training(plan: TrainingPlan, output_dir: Path, on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train with RL from `init_from`'s weights, save `model.pt`, evaluate the test split with `sampler` (an MDM);
    or a pretrained diffusion LLM's run (`sft` given): `run_text_rl`."""
    if isinstance(plan.parts, TextRLParts):
        return run_text_rl(plan, output_dir, on_start)
    return run_training(plan, output_dir, on_start, module_class=RLModule)


def run_text_rl(plan: TrainingPlan, output_dir: Path, on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """RL on `sft.model` (LoRA or every weight), then save `model/` (and `adapter/`) and evaluate as fine-tuning
    does."""
    from mdmkit.core.wording import size
    from mdmkit.models.llm.hf import load_native
    from mdmkit.training.rl.text_module import PromptIndices, TextRLModule
    from mdmkit.training.sft.train import save_and_evaluate
    from mdmkit.training.train import fit, seed_run

    parts = plan.parts
    assert isinstance(parts, TextRLParts), "a text RL run's plan"
    sft = parts.sft
    seed_run(plan.run)
    network, tokenizer = load_native(sft.model, sft.kind, dtype=sft.dtype, device="cpu")
    module = TextRLModule(plan.config, parts, network.train(), tokenizer)
    trained = sum(p.numel() for p in module.network.parameters() if p.requires_grad)
    method = "every weight" if sft.lora is None else f"LoRA r={sft.lora_r}"
    banner = "\n".join([f"model: {sft.kind} from {sft.model}, {size(trained)} parameters trained ({method})",
                        *plan.notes])
    datamodule = PromptIndices(len(module.docs), plan.data.batch_size, plan.run.seed)
    trainer, seconds = fit(plan, module, datamodule, output_dir, banner, on_start)
    return save_and_evaluate(plan, trainer, seconds, network, tokenizer, output_dir, kind="rl")

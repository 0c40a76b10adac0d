"""`train.py experiment=llada_sft sft.model=<dir>`: fine-tune a diffusion LLM, save it in the hub layout, evaluate it.

The run writes `model/` (config.json + safetensors under the hub's tensor names, LoRA merged, with the source's
tokenizer: `evaluate.py ckpt=<run>/model hf.kind=<kind>` and the model's own code load it) and, under LoRA,
`adapter/` (peft's format). The evaluation after training samples the run's `task` with its `sampler`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import CheckpointError
from mdmkit.core.wording import plural, size
from mdmkit.evaluation.evaluate import format_summary
from mdmkit.evaluation.generation import TextModel
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.text_eval import evaluate_text_task
from mdmkit.io.results import append_record
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.export import save_hub_checkpoint
from mdmkit.models.llm.hf import load_native, native_tokenizer
from mdmkit.models.llm.lora import Rounding, merged_weights, rounding, save_adapter
from mdmkit.tasks.text import TextTask
from mdmkit.training.preflight import TrainingPlan
from mdmkit.training.run_record import RunHistory, closing_summary
from mdmkit.training.sft.config import SFTConfig
from mdmkit.training.sft.data import Examples, SFTDataModule, encode, split_examples
from mdmkit.training.sft.module import NETWORK_PREFIX, SFTModule
from mdmkit.training.sft.pairs import read_pairs, task_pairs
from mdmkit.training.train import fit, ran_fast_dev_run, seed_run


def sft_examples(sft: SFTConfig, tokenizer: Any, task: TextTask | None, val_examples: int) -> tuple[Examples, Examples]:
    """Training and validation examples: `sft.train_file` (else the task's training split, which the plan made
    sure of), tokenized."""
    if sft.train_file is not None:
        pairs = read_pairs(sft.train_file)
    else:
        assert task is not None, "sft.train_file=null without a text task is refused by the plan (preflight)"
        pairs = task_pairs(task)
    val = encode(read_pairs(sft.val_file), tokenizer, sft) if sft.val_file is not None else None
    return split_examples(encode(pairs, tokenizer, sft), val, val_examples)


def network_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The network's part of the module's state dict, under the network's own names."""
    return {name.removeprefix(NETWORK_PREFIX): tensor for name, tensor in state.items()
            if name.startswith(NETWORK_PREFIX)}


def plain_network(weights: dict[str, torch.Tensor], config: Any, sft: SFTConfig) -> DiffusionLM:
    """The trained network from its weights, LoRA merged in, in float32: exactly the base plus the adapter, whatever
    dtype the base trained in (the save casts it to `save_dtype`)."""
    if sft.lora is not None:
        weights = merged_weights(weights, sft.lora.scaling)
    weights = {name: tensor.float() for name, tensor in weights.items()}
    with torch.device("meta"):
        network = DiffusionLM(config)
    network.load_state_dict(weights, assign=True)
    return network.eval()


def _report_rounding(lost: Rounding, save_dtype: str) -> None:
    """How much of the adapter a lower-precision model/ keeps: a warning once the update is off by over a percent."""
    line = (f"model/ in save_dtype={save_dtype}: {lost.describe()}. The base with adapter/ is the exact model; "
            "save_dtype=float32 saves it exactly")
    if lost.error > 0.01:
        print(f"warning: {line}", file=sys.stderr)
    else:
        print(line)


def _banner(module: SFTModule, plan: TrainingPlan, train: Examples, val: Examples) -> str:
    """What the run trains, on what (from where, how much of it held out) and what it evaluates after training."""
    sft = plan.sft
    assert sft is not None, "a fine-tuning run's plan"
    total = sum(p.numel() for p in module.network.parameters())
    trained = module.trained_parameters()
    method = "every weight" if sft.lora is None else \
        f"{trained / total:.2%}: LoRA r={sft.lora_r} on {','.join(sft.lora_targets)}"
    held = ""
    if sft.val_file is None and len(val) < plan.data.val_examples:
        held = (f" (data.val_examples={plan.data.val_examples} holds out at most a fifth of the pairs; sft.val_file "
                "gives a set of your own)")
    data = plan.notes[:1]  # where the pairs come from
    lines = [f"model: {sft.kind} from {sft.model}, {size(total)} parameters, {size(trained)} trained ({method})",
             *data, (f"data: {plural(len(train), 'training pair')}, {plural(len(val), 'validation pair')}{held}, up "
                     f"to {plural(train.tokens.shape[1], 'token')}")]
    if train.left_out:
        lines.append(f"data: {plural(train.left_out, 'pair')} longer than sft.max_length={sft.max_length} left out")
    return "\n".join([*lines, *plan.notes[1:]])


def _evaluate(plan: TrainingPlan, sft: SFTConfig, network: DiffusionLM, tokenizer: Any, task: TextTask,
              checkpoint: Path, summary: dict[str, Any], kind: str = "sft") -> None:
    """The run's `sampler` on `task`'s test documents, one row in `results_file`, the generations beside the model."""
    network = network.to(resolve_device(plan.run.device))
    sampler = build_sampler(plan.config["sampler"], network)
    model = TextModel(network, tokenizer, network.config.max_positions)
    result = evaluate_text_task(model, task, sampler, plan.data.eval_batch_size, plan.run.seed,
                                checkpoint.parent / "generations.jsonl")
    assert result is not None, "one process's result"
    summary.update(result.summary())
    row = {"kind": kind, "checkpoint": str(checkpoint), "task": task.name, "sampler": plan.config["sampler"],
           "trained": sft.describe(), **summary, "config": plan.config}
    append_record(plan.run.results_file, row)
    print(f"[{task.name}] fine-tuned model, {plural(len(task.docs('test')), 'test document')}: "
          f"{format_summary(result.summary())}")


def run_sft(plan: TrainingPlan, output_dir: Path, on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Fine-tune, save `model/` (and `adapter/`), evaluate; `on_start` runs once every check has passed."""
    config, run, data, parts = plan.config, plan.run, plan.data, plan.sft_parts
    sft, task = parts.sft, parts.task
    seed_run(run)
    try:  # the pairs first: a pair file that leaves nothing to train on stops before the weights load
        tokenizer = native_tokenizer(Path(sft.model).expanduser(), sft.kind)
    except CheckpointError as error:
        raise CheckpointError(f"cannot load the tokenizer of sft.model={sft.model}: {error}") from None
    train, val = sft_examples(sft, tokenizer, task, data.val_examples)
    network, tokenizer = load_native(sft.model, sft.kind, dtype=sft.dtype, device="cpu")
    module = SFTModule(config, parts, network.train())
    datamodule = SFTDataModule(train, val, data.batch_size, data.eval_batch_size, run.seed, data.workers)
    trainer, seconds = fit(plan, module, datamodule, output_dir, _banner(module, plan, train, val), on_start)
    return save_and_evaluate(plan, trainer, seconds, network, tokenizer, output_dir)


def save_and_evaluate(plan: TrainingPlan, trainer: L.Trainer, seconds: float, network: DiffusionLM, tokenizer: Any,
                      output_dir: Path, kind: str = "sft") -> dict[str, Any]:
    """After a run has trained `network` (its base, as loaded) through `sft`'s settings: save `model/` (and
    `adapter/`), evaluate the task's test split (a row of `kind`), say where everything is (rank 0); the run's
    summary."""
    run, parts = plan.run, plan.sft_parts
    sft, task = parts.sft, parts.task
    state = trainer.strategy.lightning_module_state_dict()  # every rank: FSDP gathers the shards to rank 0
    summary: dict[str, Any] = {"train_time_s": seconds, "global_step": trainer.global_step}
    if trainer.global_rank != 0:
        return summary
    weights = network_weights(state)
    trained = plain_network(weights, network.config, sft)
    save_dtype = getattr(torch, run.save_dtype)
    checkpoint = save_hub_checkpoint(trained, output_dir / "model", sft.kind, source=sft.model, dtype=save_dtype)
    print(f"saved: {checkpoint} (hub layout: evaluate.py ckpt={checkpoint} hf.kind={sft.kind})")
    if sft.lora is not None and save_dtype != torch.float32:
        _report_rounding(rounding(weights, sft.lora.scaling, save_dtype), run.save_dtype)
    if sft.lora is not None and sft.save_adapter:
        adapter = save_adapter(weights, sft.lora, output_dir / "adapter", base=sft.model, kind=sft.kind)
        print(f"saved: {adapter} (the LoRA adapter alone, peft's format)")
    where = {"model": str(checkpoint)}
    if sft.lora is not None and sft.save_adapter:
        where["adapter"] = str(output_dir / "adapter")
    if run.evaluate_after_training and not ran_fast_dev_run(trainer) and task is not None:
        if run.eval_limit is not None:
            task.limit = run.eval_limit
        _evaluate(plan, sft, trained.to(save_dtype), tokenizer, task, checkpoint, summary, kind)  # weights as saved
        where["results"] = f"{run.results_file} (generations: {output_dir / 'generations.jsonl'})"
    where["resume"] = f"python train.py ckpt_path={output_dir} trainer.max_steps={2 * trainer.global_step}"
    print(closing_summary(trainer.global_step, RunHistory.read(output_dir), where))
    return summary

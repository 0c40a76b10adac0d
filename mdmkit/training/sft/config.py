"""The `sft` node of a fine-tuning run (conf/sft/): what to fine-tune, on which pairs, and how to fit it in memory.

Light (no Lightning, no transformers): the CLI checks it before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mdmkit.core.config import Validated, build, require
from mdmkit.models.llm.lora import LORA_TARGETS, LoRA
from mdmkit.models.llm.registry import ModelKind, model_kind
from mdmkit.tasks.text import TextTask
from mdmkit.training.optim import OptimConfig


@dataclass
class SFTConfig(Validated):
    """`model`: a local hub-layout directory (config.json, safetensors, tokenizer) of `kind`. `dtype`: the weights
    as loaded (float32 master weights under bf16-mixed; bfloat16 halves a base that LoRA keeps frozen).
    `train_file`: JSONL of {"prompt", "response"} or {"messages": [...]} (null: the training split of the run's
    `task`, e.g. GSM8K's). `val_file`: the same for the validation loss (null: the last `data.val_examples`
    training pairs, held out). `chat`: prompts rendered with the tokenizer's chat template. `end_of_turn`: the
    token that closes an answer before its EOS padding (null: EOS only). `max_length`: longer pairs are left out,
    and counted. `lora_r` > 0 trains LoRA adapters of rank r on the `lora_targets` of every block (0: every
    weight); `save_adapter` also writes them alone."""

    model: str
    kind: str = "llada"  # a registered model kind whose record gives its fine-tuning loss (`sft_normalize`)
    # the weights as loaded; bfloat16 halves a base that LoRA keeps frozen
    dtype: Literal["float32", "bfloat16"] = "float32"
    # JSONL of {"prompt", "response"} or {"messages": [...]}; None: the task's training split
    train_file: str | None = None
    val_file: str | None = None  # None: the last data.val_examples training pairs, held out
    chat: bool = True  # prompts through the tokenizer's chat template
    end_of_turn: str | None = "<|eot_id|>"  # closes each answer before its EOS padding (None: EOS only)
    max_length: int = 1024  # tokens of prompt + answer; longer pairs are left out (counted in the banner)
    gradient_checkpointing: bool = False
    lora_r: int = 0  # > 0: LoRA adapters of this rank, every other weight frozen; 0: full fine-tuning
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = LORA_TARGETS  # mdmkit's module names in each block
    save_adapter: bool = True  # under LoRA, also write the adapter alone (adapter/, peft's format)

    def validate(self) -> None:
        self.model_kind()
        directory = Path(self.model).expanduser()
        require(directory.is_dir(), f"model={self.model}: no such directory (a local copy of the hub checkpoint)")
        require((directory / "config.json").is_file(), f"model={self.model}: no config.json in it")
        for name in ("train_file", "val_file"):
            path = getattr(self, name)
            require(path is None or Path(path).expanduser().is_file(), f"{name}={path}: no such file")
        require(self.max_length >= 2, f"max_length={self.max_length} must be >= 2")
        require(self.lora_r >= 0, f"lora_r={self.lora_r} must be >= 0 (0: full fine-tuning)")
        require(self.dtype == "float32" or self.lora_r > 0,
                f"dtype={self.dtype} with lora_r=0 would train bfloat16 weights, whose small updates round away: "
                "keep float32 weights (trainer.precision=bf16-mixed computes in bfloat16; trainer=fsdp shards them) "
                "or train LoRA adapters (sft.lora_r=16)")
        require(self.lora_alpha > 0, f"lora_alpha={self.lora_alpha} must be > 0")
        require(0.0 <= self.lora_dropout < 1.0, f"lora_dropout={self.lora_dropout} must lie in [0, 1)")
        unknown = sorted(set(self.lora_targets) - set(LORA_TARGETS))
        require(not unknown and len(self.lora_targets) > 0,
                f"lora_targets={list(self.lora_targets)}: each must be one of {', '.join(LORA_TARGETS)}")

    def model_kind(self) -> ModelKind:
        """The record of `kind`: one with a native network and a fine-tuning recipe."""
        return model_kind(self.kind, lambda kind: kind.sft_normalize is not None and kind.architecture is not None,
                          "the kinds mdmkit fine-tunes")

    @property
    def lora(self) -> LoRA | None:
        """The adapters trained (None: full fine-tuning)."""
        return LoRA(self.lora_r, self.lora_alpha, self.lora_dropout, tuple(self.lora_targets)) if self.lora_r else None

    def describe(self) -> dict[str, object]:
        """How the weights were trained, for result rows."""
        if self.lora is None:
            return {"method": "full"}
        return {"method": "lora", "r": self.lora_r, "alpha": self.lora_alpha, "targets": list(self.lora_targets)}


def sft_objective(config: dict[str, Any], sft: SFTConfig) -> Any:
    """The run's loss; `objective.normalize: null` takes the model kind's published recipe (`sft_normalize`)."""
    node = dict(config["objective"])
    if node.get("normalize") is None:
        node["normalize"] = sft.model_kind().sft_normalize
    return build(node, "objective")


@dataclass(frozen=True)
class SFTParts:
    """What a fine-tuning run's config names, built and checked once (the model loads later): its settings, its
    text task (None: no task, or one that is not text), its loss and its optimizer."""

    sft: SFTConfig
    task: TextTask | None
    objective: Any
    optim: OptimConfig


def build_sft_parts(config: dict[str, Any]) -> SFTParts:
    """Build what a fine-tuning run's config names, short of loading the model: each raises its one-line error."""
    from mdmkit.evaluation.resolve import build_sampler

    sft: SFTConfig = build(config["sft"], "sft")
    objective = sft_objective(config, sft)
    optim = build(config["optim"], "optim")
    build_sampler(config["sampler"])
    task = build(config["task"], "task") if config.get("task") is not None else None
    return SFTParts(sft, task if isinstance(task, TextTask) else None, objective, optim)

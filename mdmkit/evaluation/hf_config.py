"""How a Hugging Face model loads for a text task (evaluate.py's `hf` node, the lm-eval model's arguments).

Light: conf/'s `hf` node takes its defaults from this dataclass when Hydra composes a config, before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mdmkit.core.config import Validated, require


@dataclass
class HFModelConfig(Validated):
    """How `ckpt` (a model directory or hub name) is loaded for a text task."""

    kind: str = "generic"  # a registered model kind (`mdmkit.models.llm.registry.kind_names()`)
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    trust_remote_code: bool = False  # a kind with a native network (llada, dream, ...) always loads mdmkit's own
    max_length: int | None = None  # prompt + generation tokens, longer prompts cut from the left; None: the model's
    adapter: str | None = None  # a LoRA adapter directory (peft's format, e.g. a fine-tuning run's adapter/) merged in
    adapter_any_base: bool = False  # merge an mdmkit adapter into other weights of its kind than those it trained on

    def validate(self) -> None:
        from mdmkit.models.llm.registry import kind_names, model_kind  # torch: imported when a config is checked

        require(self.max_length is None or self.max_length >= 2, f"max_length={self.max_length} must be >= 2")
        model_kind(self.kind)
        adaptable = kind_names(lambda kind: kind.lora)
        require(self.adapter is None or self.kind in adaptable,
                f"adapter: LoRA adapters merge into mdmkit's own {', '.join(adaptable)} networks, not kind={self.kind}")
        require(self.adapter is None or Path(self.adapter).expanduser().is_dir(),
                f"adapter={self.adapter}: no such directory")

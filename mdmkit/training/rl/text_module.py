"""LightningModule of an RL run on a pretrained diffusion LLM (LLaDA, Dream): the fine-tuning module's network,
LoRA and checkpoints, trained by rollouts on a text task's prompts, rewards and policy updates.

As for an MDM (module.py), each optimizer step is one inner update on the rollouts collected at the first step of
its group of `rl.inner_updates`. The reference of a KL term is the base itself under LoRA (its adapters switched
off while it scores: no copy), else a frozen copy of the starting weights.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.evaluation.generation import TextModel
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.training.datamodule import step_indexed_loader
from mdmkit.training.rl.collecting import Collections, HoldsExperience
from mdmkit.training.rl.plan import TextRLParts
from mdmkit.training.rl.step import Experience, prepare
from mdmkit.training.rl.text_rollout import roll_out_text
from mdmkit.training.sft.module import SFTModule


@contextmanager
def adapters_off(network: torch.nn.Module) -> Iterator[None]:
    """`network`'s LoRA adapters switched off for the block: the base model scores."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in network.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class BaseOf:
    """The base under a LoRA network, as a network: its forward with the adapters off."""

    def __init__(self, network: torch.nn.Module) -> None:
        self.network = network

    def __call__(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        with adapters_off(self.network):
            return self.network(tokens, **kwargs)


class PromptIndices(L.LightningDataModule):
    """Batches of the indices of `count` training documents, step-indexed as every run's stream (no validation)."""

    def __init__(self, count: int, batch_size: int, seed: int) -> None:
        super().__init__()
        self.count, self.batch_size, self.seed = count, batch_size, seed

    def train_dataloader(self) -> DataLoader:
        return step_indexed_loader(self.trainer, (torch.arange(self.count),), self.batch_size, self.seed)


class TextRLModule(HoldsExperience, SFTModule):
    def __init__(self, config: dict[str, Any], parts: TextRLParts, network: DiffusionLM, tokenizer: Any) -> None:
        super().__init__(config, parts, network)
        assert parts.task is not None, "the plan refuses an RL run without a text task"
        self.rl, self.task, self.seed = parts.rl, parts.task, int(config.get("seed", 0))
        self.docs = self.task.docs("train")
        self.__dict__["model"] = TextModel(self.network, tokenizer, network.config.max_positions)
        self.__dict__["collections"] = Collections(self.rl, self.seed)
        self.frozen = None if self.sft.lora is not None or not self.rl.keeps_reference else \
            copy.deepcopy(self.network).requires_grad_(False)

    def reference(self) -> Any:
        if not self.rl.keeps_reference:
            return None
        return BaseOf(self.network) if self.frozen is None else self.frozen

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:  # type: ignore[override]
        collections: Collections = self.__dict__["collections"]

        def collected(seed: int) -> Experience:
            docs = [self.docs[i] for i in batch[0].tolist()]
            rollouts = roll_out_text(self.__dict__["model"], self.rl.sampler, self.task, docs, self.rl.group_size,
                                     seeded_generator(stream_seed(seed, 0), self.device))
            return prepare(self.network, self.reference(), self.rl, self.task, rollouts, seed, collections.failures)

        return collections.loss(self, batch_idx, collected, self.network)

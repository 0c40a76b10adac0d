"""Prompted text generation with NFE accounting, shared by `evaluate.py task=gsm8k|...` and the lm-eval model.

A masked model gets its prompts left-padded in a batch, followed by `gen_length` mask tokens that any mdmkit
sampler fills; a causal model decodes greedily with a KV cache (the NTP baseline). Both stop a row once its
settled text contains a stop phrase (generate_until during generation, not only truncation afterwards), and
both report each row's forward passes to full length and to the stop point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from mdmkit.core.stopping import TextStop
from mdmkit.models.hf import HFCausalLM, HFMaskedDiffusion
from mdmkit.samplers import ForwardCounter, MaskedSampler
from mdmkit.tasks.extraction import truncate_at_stop


@dataclass
class TextModel:
    """A network with its tokenizer: masked (any sampler) or causal (greedy NTP)."""

    network: HFMaskedDiffusion | HFCausalLM
    tokenizer: Any
    max_length: int | None = None  # prompt + generation budget; longer prompts lose their start

    @property
    def causal(self) -> bool:
        return isinstance(self.network, HFCausalLM)

    @property
    def pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    def decode(self, ids: list[int]) -> str:
        # special tokens stay: stop phrases such as "<|endoftext|>" are special tokens
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_prompt(self, prompt: str, chat: bool, gen_length: int) -> list[int]:
        if chat:
            prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                        add_generation_prompt=True)
        ids = list(self.tokenizer(prompt)["input_ids"])
        closing = {self.tokenizer.sep_token_id, self.tokenizer.eos_token_id} - {None}
        if ids and ids[-1] in closing:  # BERT-style tokenizers close the text; generation continues it
            ids = ids[:-1]
        if self.max_length is not None:
            room = self.max_length - gen_length
            if room < 1:
                raise ValueError(f"max_length={self.max_length} leaves no room for a prompt beside "
                                 f"{gen_length} generated tokens")
            ids = ids[-room:]  # cut from the left, as the EB paper does for over-long prompts
        return ids


@dataclass
class Generations:
    """Per prompt: the raw answer text, the text cut at the stop phrase, NFE to full length and to the stop."""

    raw: list[str]
    texts: list[str]
    nfe: np.ndarray
    nfe_to_stop: np.ndarray
    answer_tokens: np.ndarray  # tokens of the kept (stop-truncated) answer
    wall_time_s: float


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids [B, P] left-padded to the longest row, and the mask of real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    keep = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row)
            keep[i, width - len(row):] = True
    return ids.to(device), keep.to(device)


def _settled(ids: torch.Tensor, mask_id: int | None) -> list[int]:
    """The answer ids before the first still-masked position (rows stopped early keep masks after it)."""
    values = ids.tolist()
    if mask_id is not None and mask_id in values:
        values = values[: values.index(mask_id)]
    return values


@torch.no_grad()
def generate(
    model: TextModel,
    prompts: list[str],
    sampler: MaskedSampler | None,
    gen_length: int,
    stops: list[str],
    *,
    batch_size: int = 8,
    seed: int = 0,
    chat: bool = False,
    progress: bool = True,
) -> Generations:
    """Generate an answer for every prompt (`sampler` is ignored by causal models, which decode greedily)."""
    if gen_length < 1:
        raise ValueError(f"gen_length={gen_length} must be >= 1")
    if not model.causal and sampler is None:
        raise ValueError("a masked model needs a sampler")
    device = next(model.network.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    stop = TextStop(tuple(stops), model.decode) if stops else None
    raw, nfe, to_stop = [], [], []
    start = time.perf_counter()
    for begin in tqdm(range(0, len(prompts), batch_size), desc="generating", disable=not progress, leave=False):
        encoded = [model.encode_prompt(p, chat, gen_length) for p in prompts[begin: begin + batch_size]]
        ids, keep = left_pad(encoded, model.pad_id, device)
        if model.causal:
            finished = None if stop is None else (
                lambda made: stop.met(made, torch.ones_like(made, dtype=torch.bool), -1))
            answers, counts = model.network.greedy_generate(ids, gen_length, {model.tokenizer.eos_token_id} - {None},
                                                            attention_mask=keep, stop_when=finished)
            raw += [model.decode(row.tolist()) for row in answers]
            nfe.append(counts)
            to_stop.append(counts)
            continue
        mask_id = model.network.mask_id
        canvas = torch.cat([ids, torch.full((len(encoded), gen_length), mask_id, device=device)], 1)
        attention = torch.cat([keep, torch.ones_like(canvas[:, ids.shape[1]:], dtype=torch.bool)], 1)
        counter = ForwardCounter(model.network, len(encoded))
        sampled = sampler.sample(counter, canvas, mask_id, generator,
                                 attention_mask=None if bool(keep.all()) else attention, stop=stop)
        raw += [model.decode(_settled(row, mask_id)) for row in sampled.tokens[:, ids.shape[1]:].cpu()]
        nfe.append(counter.nfe)
        to_stop.append(torch.where(counter.nfe_at_stop >= 0, counter.nfe_at_stop, counter.nfe))
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    texts = [truncate_at_stop(text, stops) for text in raw]
    kept = np.array([len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts])
    return Generations(raw, texts, torch.cat(nfe).numpy(), torch.cat(to_stop).numpy(), kept, wall)

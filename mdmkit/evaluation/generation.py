"""Prompted text generation with NFE accounting, shared by `evaluate.py task=gsm8k|...` and the lm-eval model.

A masked model's prompts are left-padded and followed by `gen_length` masks that any masked sampler fills; a
causal LM's (a causal kind's) are left-aligned and filled left to right by a causal decoder (`sampler=ntp`, SBD).
A sampler of the other kind is refused in one line before any forward.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.core.progress import ForwardTicks, progress_bar
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.core.stopping import AnswerBudget, AnyStop, Stop, StopCondition, TextStop
from mdmkit.evaluation.distributed import SINGLE_PROCESS, Ranks
from mdmkit.models.canvas import CanvasSpec
from mdmkit.models.denoiser import CANVAS, require_capabilities
from mdmkit.models.llm.hf import HFCausalLM
from mdmkit.samplers import ForwardCounter, NTPDecoder, Sampler, SBDSampler
from mdmkit.tasks.extraction import truncate_at_stop

CAUSAL_DECODERS = (NTPDecoder, SBDSampler)  # fill a suffix left to right with a KV cache: causal LMs only


@runtime_checkable
class MaskedNetwork(Protocol):
    """What a text model reads of a masked network besides its forward: the token it fills (`HFMaskedDiffusion`,
    mdmkit's `DiffusionLM`, a registered kind's own network)."""

    mask_id: int


@dataclass
class TextModel:
    """A network with its tokenizer: masked (masked samplers) or causal (causal decoders: `sampler=ntp`)."""

    network: torch.nn.Module  # a MaskedNetwork, or an HFCausalLM
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

    @property
    def end_ids(self) -> tuple[int, ...]:
        """The ids that end an answer, one set for the sampler's stop and the cut of the scored text. A network that
        states its own wins (a canvas network's generation config: the ids its loop ends rows at, as its `generate`
        does; Gemma's <end_of_turn> beside <eos>); else the tokenizer's end-of-text token."""
        spec = getattr(self.network, "canvas", None)
        if isinstance(spec, CanvasSpec) and spec.eos_ids:
            return spec.eos_ids
        eos = self.tokenizer.eos_token_id
        return () if eos is None else (int(eos),)

    def mask_id_for(self, sampler: Sampler | None) -> int:
        """The id of the positions to fill. A masked model: its mask token. A causal LM decoded by NTP: an id
        past the vocabulary (NTP only runs the settled prefix, so it is never fed, and it is never generated).
        SBD feeds masks to the model: the tokenizer's mask token, the one an SBD fine-tune learnt."""
        if not isinstance(self.network, HFCausalLM):
            assert isinstance(self.network, MaskedNetwork), "a masked network has a mask_id"
            return self.network.mask_id
        if isinstance(sampler, SBDSampler):
            if self.tokenizer.mask_token_id is None:
                raise ConfigError("sampler=sbd feeds mask tokens to the causal LM, but its tokenizer has no "
                                  "mask token: use sampler=ntp")
            return int(self.tokenizer.mask_token_id)
        return max(self.network.vocab_size, len(self.tokenizer))

    def decode(self, ids: list[int]) -> str:
        # special tokens stay: stop phrases such as "<|endoftext|>" are special tokens
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """`messages` in the tokenizer's chat template, as text (evaluate.py's `task.chat=true`: one user message; the
        lm-eval model's `--apply_chat_template`)."""
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt))

    def encode_prompt(self, prompt: str, chat: bool, gen_length: int) -> tuple[list[int], bool]:
        """The prompt's ids, and whether its start was cut to leave room for `gen_length` answer tokens."""
        if chat:
            prompt = self.chat([{"role": "user", "content": prompt}])
        # a text that starts with the tokenizer's <bos> (a chat template writes it: Gemma's, here or through
        # lm-eval's --apply_chat_template) gets no second one from the tokenizer
        bos = self.tokenizer.bos_token
        special = not (isinstance(bos, str) and bos and prompt.startswith(bos))
        ids = list(self.tokenizer(prompt, add_special_tokens=special)["input_ids"])
        closing = {self.tokenizer.sep_token_id, self.tokenizer.eos_token_id} - {None}
        if ids and ids[-1] in closing:  # BERT-style tokenizers close the text; generation continues it
            ids = ids[:-1]
        if self.max_length is None:
            return ids, False
        room = self.max_length - gen_length
        if room < 1:
            raise ConfigError(f"{gen_length} answer tokens leave no room for a prompt in the model's {self.max_length} "
                              "positions: fewer answer tokens (evaluate.py: task.max_gen_len=N; mdmkit-lm-eval: "
                              "--gen_kwargs max_gen_toks=N) or a longer max_length")
        return ids[-room:], len(ids) > room  # cut from the left, as the EB paper does for over-long prompts


@dataclass
class Generations:
    """Per prompt: the raw answer text, the text scored (cut at the end ids and the stop phrase), NFE to
    full length and to the stop."""

    raw: list[str]
    texts: list[str]
    nfe: np.ndarray
    nfe_to_stop: np.ndarray
    answer_tokens: np.ndarray  # tokens of the kept (stop-truncated) answer
    wall_time_s: float
    computed_tokens: np.ndarray  # tokens the network ran per prompt, over all its forwards
    prompts_cut: int = 0  # prompts whose start was cut to fit the model's positions
    extra_cost: dict[str, np.ndarray] = field(default_factory=dict)  # passes beside NFE per prompt (an encoder's)


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


def check_decoder(causal: bool, sampler: Sampler | None) -> None:
    """Refuse, in one line, a sampler of the wrong kind: a causal LM (a causal kind) generates with a causal
    decoder (`sampler=ntp`), a masked diffusion model with a masked sampler."""
    name = "none" if sampler is None else type(sampler).__name__
    if causal and not isinstance(sampler, CAUSAL_DECODERS):
        raise CapabilityError(f"a causal LM generates with a causal decoder: pass sampler=ntp (got sampler {name})")
    if not causal and sampler is None:
        raise ConfigError("a masked diffusion model needs a sampler (e.g. sampler=eb)")
    if not causal and isinstance(sampler, CAUSAL_DECODERS):
        raise CapabilityError(f"sampler {name} decodes causal LMs, not a masked diffusion "
                              f"model: pick a masked sampler (e.g. sampler=eb)")


def check_trained_for(objective: str, sampler: Sampler) -> None:
    """Refuse, in one line, a sampler that reads the logits of an mdmkit model otherwise than its objective
    (`_target_`) trained them: next-token logits predict the following position, masked ones their own."""
    name, causal = type(sampler).__name__, isinstance(sampler, CAUSAL_DECODERS)
    if objective.endswith(".NextTokenLoss") and not causal:
        raise CapabilityError(f"this model was trained for next-token prediction (NextTokenLoss), whose logits "
                              f"predict the following position: decode it with sampler=ntp, not {name}")
    if objective.endswith(".MaskedDiffusionLoss") and causal:
        raise CapabilityError(f"this model was trained as a masked diffusion model: sampler {name} decodes "
                              "next-token models; pick a masked sampler (e.g. sampler=eb)")
    if objective.endswith(".UniformDiffusionLoss") and CANVAS not in sampler.requires:
        raise CapabilityError(f"this model was trained on uniform noise (UniformDiffusionLoss) and has no mask token "
                              f"to unmask: decode it with sampler=diffusion_gemma (revisable canvases), not {name}")


def check_sampler(model: TextModel, sampler: Sampler | None) -> None:
    """What `generate` refuses before its first forward: the sampler's kind, capabilities and mask id."""
    check_decoder(model.causal, sampler)
    require_capabilities(sampler, model.network)
    model.mask_id_for(sampler)


def masked_canvas(rows: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """Left-padded prompts then `gen_length` masks; the padding mask (None without padding); answer starts."""
    ids, keep = left_pad(rows, pad_id, device)
    canvas = torch.cat([ids, torch.full((len(rows), gen_length), mask_id, device=device)], 1)
    attention = torch.cat([keep, torch.ones_like(canvas[:, ids.shape[1]:], dtype=torch.bool)], 1)
    return canvas, None if bool(keep.all()) else attention, [ids.shape[1]] * len(rows)


def _causal_canvas(rows: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
                   device: torch.device) -> tuple[torch.Tensor, None, list[int]]:
    """Left-aligned prompts (an empty one becomes the pad token), masks to a common width; answer starts."""
    rows = [row or [pad_id] for row in rows]
    canvas = torch.full((len(rows), max(map(len, rows)) + gen_length), mask_id, dtype=torch.long)
    for i, row in enumerate(rows):
        canvas[i, : len(row)] = torch.tensor(row)
    return canvas.to(device), None, [len(row) for row in rows]


def _row_groups(model: TextModel, sampler: Sampler, encoded: Sequence[list[int]]) -> list[list[int]]:
    """Rows of a batch that are sampled together: all, except under SBD on a causal LM, whose blocks would run
    past `gen_length` after a shorter prompt of the batch: there, rows of equal prompt length."""
    if not (model.causal and isinstance(sampler, SBDSampler)):
        return [list(range(len(encoded)))]
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(encoded):
        groups.setdefault(max(len(row), 1), []).append(i)
    return list(groups.values())


def _settled(ids: torch.Tensor, mask_id: int, end_ids: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The answer ids before the first still-masked position (rows stopped early keep masks after it), and the
    part of them before the first end id (what is scored: the model ended its answer there)."""
    values = ids.tolist()
    if mask_id in values:
        values = values[: values.index(mask_id)]
    end = next((i for i, value in enumerate(values) if value in end_ids), len(values))
    return values, values[:end]


@torch.no_grad()
def generate(
    model: TextModel,
    prompts: list[str],
    sampler: Sampler,
    gen_length: int,
    stops: list[str],
    *,
    batch_size: int = 8,
    seed: int = 0,
    chat: bool = False,
    progress: bool = True,
    ranks: Ranks = SINGLE_PROCESS,
) -> Generations | None:
    """An answer of at most `gen_length` tokens for every prompt, by `sampler` through a forward counter. A row
    stops being sampled once its settled text reaches an end id (`TextModel.end_ids`) or a stop phrase; only the
    text before them is scored, and each row's NFE is counted to full length and to that stop.

    Batch `i` draws from random stream `i` of `seed`; under data parallelism (`ranks`) each process runs its share
    of the batches and rank 0 returns every prompt's answer, the other ranks None."""
    if gen_length < 1:
        raise ValueError(f"gen_length={gen_length} must be >= 1")
    check_sampler(model, sampler)
    mask_id = model.mask_id_for(sampler)
    device = next(model.network.parameters()).device
    end_ids = model.end_ids
    conditions: list[Stop] = [StopCondition.of(list(end_ids))] if end_ids else []
    if stops:
        conditions.append(TextStop(tuple(stops), model.decode))
    if model.causal:
        conditions.append(AnswerBudget(gen_length))
    stop = AnyStop(tuple(conditions)) if conditions else None
    make_canvas = _causal_canvas if model.causal else masked_canvas
    # row -> raw text, text before the end token, NFE, NFE to the stop, computed tokens, passes beside NFE by kind
    rows_made: dict[int, tuple[str, str, int, int, int, dict[str, float]]] = {}
    start = time.perf_counter()
    batches = ranks.batches(len(prompts), batch_size)
    bar = progress_bar(total=len(batches), desc="generating", unit="batch", disable=not (progress and ranks.main),
                       leave=False)
    ticks = ForwardTicks(bar)
    prompts_cut = 0
    for batch in batches:
        encoded, cut = zip(*(model.encode_prompt(p, chat, gen_length) for p in prompts[batch.begin: batch.end]))
        prompts_cut += sum(cut)
        generator = seeded_generator(stream_seed(seed, batch.index), device)
        for group in _row_groups(model, sampler, encoded):
            canvas, attention, starts = make_canvas([encoded[i] for i in group], gen_length, mask_id,
                                                    model.pad_id, device)
            counter = ForwardCounter(model.network, len(group), on_forward=ticks)
            sampled = sampler.sample(counter, canvas, mask_id, generator, attention_mask=attention, stop=stop)
            to_stop = counter.nfe_to_stop
            for j, (i, tokens, first) in enumerate(zip(group, sampled.tokens.cpu(), starts)):
                settled, ended = _settled(tokens[first: first + gen_length], mask_id, end_ids)
                extra = {kind: float(cost[j]) for kind, cost in counter.extra.items()}
                rows_made[batch.begin + i] = (model.decode(settled), model.decode(ended), int(counter.nfe[j]),
                                              int(to_stop[j]), int(counter.tokens[j]), extra)
        bar.update(1)
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    gathered = ranks.gather((rows_made, time.perf_counter() - start, prompts_cut))
    if gathered is None:
        return None
    made = {row: values for part, *_ in gathered for row, values in part.items()}
    cut_total = sum(cut for *_, cut in gathered)
    if cut_total:
        print(f"{cut_total} of {len(prompts)} prompts were longer than the {model.max_length} positions leave beside "
              f"{gen_length} answer tokens: their starts were cut (shots first)", file=sys.stderr, flush=True)
    ordered = [made[row] for row in range(len(prompts))]
    raw = [text for text, *_ in ordered]
    texts = [truncate_at_stop(text, stops) for _, text, *_ in ordered]
    kept = np.array([len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts], dtype=np.int64)

    def column(i: int) -> np.ndarray:
        return np.array([values[i] for values in ordered], dtype=np.int64)

    kinds = sorted({kind for *_, extra in ordered for kind in extra})
    extra_cost = {kind: np.array([extra.get(kind, 0.0) for *_, extra in ordered]) for kind in kinds}
    return Generations(raw, texts, column(2), column(3), kept, max(seconds for _, seconds, _ in gathered), column(4),
                       cut_total, extra_cost)

"""Rollouts of a pretrained diffusion LLM (LLaDA, Dream) on a text task's prompts, by any masked sampler.

The canvas is the one evaluation samples (`masked_canvas`: left-padded prompts, then `max_gen_len` masks) with the
same stops (the model's end ids, the task's stop phrases). A rollout's answer, what its likelihood scores, is its
settled text up to and with its end token, as d1 scores completions; positions after a stop are neither scored nor
unfinished. A row still holding masks inside its answer ran out of the sampler's budget: it is unfinished.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mdmkit.core.stopping import AnyStop, Stop, StopCondition, TextStop
from mdmkit.evaluation.generation import TextModel, masked_canvas
from mdmkit.samplers import Sampler
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.tasks.extraction import truncate_at_stop
from mdmkit.tasks.text import TextTask
from mdmkit.training.rl.rollout import Rollouts, evaluating


def _answer(ids: list[int], mask_id: int, end_ids: tuple[int, ...], stopped: bool) -> tuple[int, int]:
    """(positions the answer spans, positions of its text): through the first end id (the text before it), else
    the settled prefix if the row stopped there, else every position (the masks left: unfinished)."""
    settled = ids.index(mask_id) if mask_id in ids else len(ids)
    end = next((i for i, value in enumerate(ids[:settled]) if value in end_ids), None)
    if end is not None:
        return end + 1, end
    return (settled if stopped else len(ids)), settled


@torch.no_grad()
def roll_out_text(model: TextModel, sampler: Sampler, task: TextTask, docs: Sequence[dict], group_size: int,
                  generator: torch.Generator | None) -> Rollouts:
    """`group_size` rollouts of each document's prompt (the task's few-shot format and chat setting), with their
    texts cut at the task's stop phrases, as its verifier scores them."""
    fewshot = task.fewshot_docs()
    gen_length = task.max_gen_len
    encoded = [model.encode_prompt(task.format_prompt(doc, fewshot), task.chat, gen_length)[0]
               for doc in docs for _ in range(group_size)]
    device = next(model.network.parameters()).device
    mask_id = model.mask_id_for(sampler)
    canvas, attention, starts = masked_canvas(encoded, gen_length, mask_id, model.pad_id, device)
    stops = task.stop_phrases
    conditions: list[Stop] = [StopCondition.of(list(model.end_ids))] if model.end_ids else []
    if stops:
        conditions.append(TextStop(tuple(stops), model.decode))
    counter = ForwardCounter(model.network, len(encoded))
    with evaluating(model.network):
        sampled = sampler.sample(counter, canvas, mask_id, generator, attention_mask=attention,
                                 stop=AnyStop(tuple(conditions)) if conditions else None)
    start = starts[0]
    answer = torch.zeros_like(canvas, dtype=torch.bool)
    texts = []
    for row, ids in enumerate(sampled.tokens[:, start:].tolist()):
        spans, text = _answer(ids, mask_id, model.end_ids, bool(counter.nfe_at_stop[row] >= 0))
        answer[row, start: start + spans] = True
        texts.append(truncate_at_stop(model.decode(ids[:text]), stops))
    tokens = sampled.tokens
    return Rollouts(tokens, tokens.clone(), answer, counter.nfe.clone(), mask_id, group_size, texts,
                    [doc for doc in docs for _ in range(group_size)], attention=attention)


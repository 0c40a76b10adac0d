"""Rollouts: G completions of each prompt by any mdmkit sampler, with each one's forwards counted.

The sampler sees the network only through a `ForwardCounter`, as in evaluation, so the NFE a rollout records is
the one it cost and the one a reward may charge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from mdmkit.models.denoiser import Denoiser
from mdmkit.samplers import Sampler
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.tasks.base import PuzzleTask


@dataclass
class Rollouts:
    """A batch of rollouts, the G of each prompt in consecutive rows. `tokens`: the sampler's output (the mask id
    where it left a position unfilled); `target`, `answer_mask`: the example each came from (for the verifier);
    `nfe`: forwards each row cost; `texts`, `docs`: a text task's generations and documents; `attention`: the
    mask of real tokens where prompts are left-padded."""

    tokens: torch.Tensor  # [B, L]
    target: torch.Tensor  # [B, L]
    answer_mask: torch.Tensor  # [B, L] bool: the positions the sampler filled
    nfe: torch.Tensor  # [B] long
    mask_id: int
    group_size: int
    texts: Sequence[str] | None = None
    docs: Sequence[dict] | None = None
    attention: torch.Tensor | None = None  # [B, L] bool
    _decoded: list[str] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def unfilled(self) -> torch.Tensor:
        """[B, L] positions of the answer the sampler left masked (it ran out of its step budget)."""
        return self.answer_mask & (self.tokens == self.mask_id)

    @property
    def finished(self) -> torch.Tensor:
        """[B] rows whose every answer position was filled."""
        return ~self.unfilled.any(1)

    @property
    def completion(self) -> torch.Tensor:
        """[B, L] the positions a likelihood estimate scores: the answer's filled ones."""
        return self.answer_mask & ~self.unfilled

    def text(self, task: PuzzleTask | None) -> list[str]:
        """Each rollout as text: the generations of a text task, else the puzzle task's decoding of its tokens."""
        if self.texts is not None:
            return list(self.texts)
        if self._decoded is None:
            assert task is not None, "a puzzle rollout decodes through its task"
            self._decoded = [task.decode(row) for row in self.tokens.cpu()]
        return self._decoded


@contextmanager
def evaluating(network: object) -> Iterator[None]:
    """`network` in eval mode for the block (where it is a module), its mode restored after."""
    if not isinstance(network, torch.nn.Module):
        yield
        return
    was_training = network.training
    network.eval()
    try:
        yield
    finally:
        network.train(was_training)


def with_attention(network: Callable[..., torch.Tensor], attention: torch.Tensor | None
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
    """`network` hiding the rollouts' left padding; an estimator that stacks copies of the batch (coupled masks,
    the ELBO's samples) gets the padding mask stacked the same way."""
    if attention is None:
        return network

    def scored(tokens: torch.Tensor) -> torch.Tensor:
        keep = attention.repeat(tokens.shape[0] // attention.shape[0], 1)
        return network(tokens, attn_mask=keep[:, None, None, :])  # over heads and queries, as samplers pass it

    return scored


@torch.no_grad()
def roll_out(network: Denoiser, sampler: Sampler, task: PuzzleTask, tokens: torch.Tensor, answer_mask: torch.Tensor,
             group_size: int, generator: torch.Generator | None) -> Rollouts:
    """`group_size` rollouts of each example of `tokens` / `answer_mask` [P, L]: its answer masked, filled by
    `sampler` (in eval mode, the network's mode restored after)."""
    target = tokens.repeat_interleave(group_size, 0)
    answer = answer_mask.repeat_interleave(group_size, 0)
    counter = ForwardCounter(network, target.shape[0])
    with evaluating(network):
        sampled = sampler.sample(counter, target.masked_fill(answer, task.mask_id), task.mask_id, generator,
                                 stop=task.stop_condition())
    return Rollouts(sampled.tokens, target, answer, counter.nfe.clone(), task.mask_id, group_size)

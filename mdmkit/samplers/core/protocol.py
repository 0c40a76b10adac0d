"""The sampler contract: what every sampler takes and returns, stated once.

A sampler sees the network only through a `ForwardCounter` (a rule inside another sampler's walk: through a
`CountedNetwork` view of it), lists what it needs beyond logits in `requires` (checked
against the network's capabilities before the first forward), holds configuration only (networks besides the
denoiser come loaded) and keeps no state from one `sample` call to the next (docs/samplers.md, "The sampler contract").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdmkit.core.config import Validated
from mdmkit.core.stopping import Stop
from mdmkit.samplers.core.counting import ForwardCounter


@dataclass
class Sampled:
    """A finished batch: the tokens and, per position, the row's step that revealed it (-1: given)."""

    tokens: torch.Tensor  # [B, L]
    reveal_step: torch.Tensor  # [B, L]
    steps: torch.Tensor  # [B] steps each row took

    def partition(self, row: int) -> list[list[int]]:
        """Row `row`'s trajectory as an ordered partition: the positions revealed at each step."""
        steps = self.reveal_step[row]
        return [torch.nonzero(steps == s).flatten().tolist() for s in range(int(self.steps[row]))]


@dataclass(frozen=True)
class Canvas:
    """One `sample` call: the batch to fill and the rules of filling it."""

    tokens: torch.Tensor  # [B, L]; every `mask_id` position is to be filled
    mask_id: int
    generator: torch.Generator | None = None  # the only source of randomness (the rows' shared stream)
    attention_mask: torch.Tensor | None = None  # [B, L], True = a real token: hides left padding
    stop: Stop | None = None  # generate_until: rows end at a settled stop sequence
    # each row's own stream instead of the shared one, for a rule that draws per row (SDAR's): a batched row then
    # draws what it draws alone with the same generator; rules that do not draw per row keep `generator`
    row_generators: tuple[torch.Generator, ...] | None = None

    def generators_of(self, rows: torch.Tensor) -> tuple[torch.Generator, ...] | None:
        """The own streams of batch rows `rows` [R] (None without them), for a walk's canvas of those rows."""
        return None if self.row_generators is None else tuple(self.row_generators[int(r)] for r in rows.tolist())


@dataclass
class Sampler(Validated):
    """Base of every sampler: masked diffusion (ordering x budget x choice), P2, NI, NTP and SBD, window and
    self-speculative. Fields are configuration only; subclasses implement `fill`."""

    @property
    def requires(self) -> frozenset[str]:
        """Capabilities the network must declare (none: any); a sampler states them as a class attribute, or a
        property where its settings decide."""
        return frozenset()

    @torch.no_grad()
    def sample(
        self,
        network: ForwardCounter,
        tokens: torch.Tensor,
        mask_id: int,
        generator: torch.Generator | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        stop: Stop | None = None,
        row_generators: tuple[torch.Generator, ...] | None = None,
    ) -> Sampled:
        """Fill every `mask_id` position of `tokens` [B, L].

        `attention_mask` [B, L] (True = a real token) hides left padding; `stop` ends rows at a stop sequence
        (generate_until; the counter notes each row's NFE at that point). Draws use `generator` only, or, in a rule
        that draws per row, `row_generators` (one per row) where given.
        """
        return self.fill(network, Canvas(tokens, mask_id, generator, attention_mask, stop, row_generators))

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill `canvas` through `network`, which charges every forward to the rows it ran on."""
        raise NotImplementedError

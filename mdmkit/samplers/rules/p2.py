"""P2 path planning: each step may reveal masked positions *and* re-mask revealed ones.

Peng et al., "Path Planning for Masked Diffusion Model Sampling", Algorithm 1: every step the denoiser proposes x0
for every position, all non-fixed positions are ranked by one score (log p of their proposal; for revealed ones, an
external planner's if set, scaled by the stochasticity strength eta: 0 never re-masks, 1 is RDM) and exactly
floor(n * (1 - kappa(t))) of the n non-fixed positions stay masked. Revealed positions that survive keep their token.
The paper's Listing 1 differs; see p2_listing.py and docs/samplers.md ("Reference checks").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mdmkit.core.config import require
from mdmkit.core.errors import CapabilityError
from mdmkit.models.denoiser import without_mask
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler

# kappa(t): the fraction of non-fixed positions revealed after the step at time t in (0, 1]; each is
# non-decreasing with kappa(1) = 1, so the masked count never grows and the last step reveals everything.
KAPPAS: dict[str, Callable[[float], float]] = {
    "linear": lambda t: t,
    "cosine": lambda t: 1.0 - math.cos(math.pi * t / 2),  # few reveals early, many late
    "sqrt": math.sqrt,  # many reveals early, few late
}
SCORES = ("confidence", "random")

# floor(n * (1 - kappa)) is taken with this slack so that 10 * (1 - 0.3) = 6.999... still counts as 7.
_FLOOR_SLACK = 1e-9


def draw_proposal(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 for every position and log p(x0) under the (tempered) softmax: the argmax at temperature 0, else a
    Gumbel-max draw whose noise comes from `generator` only."""
    if temperature == 0.0:
        logp, tokens = logits.log_softmax(-1).max(-1)
        return tokens, logp
    logp_all = (logits / temperature).log_softmax(-1)
    uniform = torch.rand(logp_all.shape, generator=generator, device=logp_all.device, dtype=logp_all.dtype)
    tokens = (logp_all - (-uniform.log()).log()).argmax(-1)
    return tokens, logp_all.gather(-1, tokens[..., None]).squeeze(-1)


def lowest(score: torch.Tensor, count: torch.Tensor, ties_first: torch.Tensor) -> torch.Tensor:
    """Bool [R, L]: the `count[r]` lowest scores of each row, equal scores going to `ties_first` positions first,
    then to the lower index (deterministic, and independent of the other rows)."""
    prior = torch.argsort((~ties_first).long(), dim=1, stable=True)
    order = prior.gather(1, score.gather(1, prior).argsort(dim=1, stable=True))
    columns = torch.arange(score.shape[1], device=score.device)
    return torch.zeros_like(ties_first).scatter(1, order, columns[None, :] < count[:, None])


@dataclass
class _Run:
    """What stays fixed over one `sample` call, for the rows that have anything to fill."""

    counter: ForwardCounter
    rows: torch.Tensor  # [R] batch rows being sampled
    fixed: torch.Tensor  # [R, L] given positions: never changed, never masked
    free: torch.Tensor  # [R] number of non-fixed positions
    mask_id: int
    kwargs: dict[str, Any]  # forwarded to the denoiser and the planner (the attention mask)
    generator: torch.Generator | None
    planner: Callable[..., torch.Tensor] | None
    planner_share: float


@dataclass
class P2Sampler(Sampler):
    """P2 path planning: `steps` denoiser forwards per row, with re-masking. `planner` (BERT-planning, loaded from
    `sampler.planner=<model.pt>`) scores the revealed positions; its passes cost `planner_cost` forwards each
    (default: the ratio of parameter counts, or 1 when that is unknown)."""

    steps: int = 64
    eta: float = 1.0  # re-masking strength: 0 never re-masks (greedy ancestral), 1 is RDM
    kappa: str = "linear"  # linear | cosine | sqrt
    score: str = "confidence"  # confidence | random
    temperature: float = 0.0  # 0: argmax; > 0: Gumbel-max draw from softmax(logits / T)
    planner: Any = None  # tokens [R, L] -> logits [R, L, V]
    planner_cost: float | None = None  # a planner pass in denoiser forwards (None: parameter-count ratio)

    def validate(self) -> None:
        require(self.steps >= 1, f"steps={self.steps} must be >= 1")
        require(self.eta >= 0.0, f"eta={self.eta} must be >= 0")
        require(self.kappa in KAPPAS, f"kappa='{self.kappa}' is not one of {', '.join(KAPPAS)}")
        require(self.score in SCORES, f"score='{self.score}' is not one of {', '.join(SCORES)}")
        require(self.temperature >= 0.0, f"temperature={self.temperature} must be >= 0")
        require(self.planner_cost is None or self.planner_cost >= 0.0,
                f"planner_cost={self.planner_cost} must be >= 0 or null")
        require(self.planner is None or callable(self.planner),
                "planner must be a loaded network (evaluate.py loads sampler.planner=path/to/model.pt)")
        require(self.planner is None or self.score == "confidence",
                "a planner only re-scores confidences: it needs score='confidence'")

    def masked_count(self, free: torch.Tensor, step: int) -> torch.Tensor:
        """How many non-fixed positions stay masked after 0-based `step`; none after the last one."""
        if step + 1 >= self.steps:
            return torch.zeros_like(free)
        unrevealed = 1.0 - KAPPAS[self.kappa]((step + 1) / self.steps)
        return torch.floor(free.double() * unrevealed + _FLOOR_SLACK).long().clamp(0)

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x0 at every position and its score log p(x0) (see `draw_proposal`)."""
        return draw_proposal(logits, self.temperature, generator)

    def remask(self, score: torch.Tensor, count: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """Bool [R, L]: the positions masked after this step, the `count` lowest scores (Algorithm 1's TopPos)."""
        return lowest(score, count, ties_first=masked)

    def planner_input(self, state: torch.Tensor, x0: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
        """What the planner reads: the proposal x0 with the given tokens restored."""
        return torch.where(fixed, state, x0)

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill every masked position in exactly `steps` forwards per row (rows with nothing to fill: none)."""
        mask_id, generator, attention_mask = canvas.mask_id, canvas.generator, canvas.attention_mask
        if canvas.stop is not None:
            raise CapabilityError(f"{type(self).__name__} cannot run on a task with a stop condition (revealed "
                                  "tokens can be re-masked, so no position is ever settled): pick another sampler")
        x = canvas.tokens.clone()
        fixed = x != mask_id
        reveal_step = torch.full_like(x, -1)
        steps = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        rows = (~fixed).any(1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return Sampled(x, reveal_step, steps)
        share = self.planner_cost
        if share is None:
            share = 0.0 if self.planner is None else network.share_of(self.planner)
        run = _Run(
            counter=network, rows=rows, fixed=fixed[rows], free=(~fixed[rows]).sum(1), mask_id=mask_id,
            kwargs={} if attention_mask is None else {"attn_mask": attention_mask[rows][:, None, None, :]},
            generator=generator, planner=self.planner, planner_share=share,
        )
        state, revealed_at = x[rows], reveal_step[rows]
        for step in range(self.steps):
            state, revealed_at = self._step(run, state, revealed_at, step)
        x[rows], reveal_step[rows], steps[rows] = state, revealed_at, self.steps
        return Sampled(x, reveal_step, steps)

    def _step(
        self, run: _Run, state: torch.Tensor, revealed_at: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One denoiser forward: propose x0, score, keep the best positions, mask the rest."""
        masked = state == run.mask_id
        revealed = ~masked & ~run.fixed
        logits = without_mask(run.counter(state, run.rows, **run.kwargs), run.mask_id, torch.float64)
        x0, logp = self.propose(logits, run.generator)
        score = self._scores(run, state, x0, logp, revealed, logits.shape[-1])
        remask = self.remask(score, self.masked_count(run.free, step), masked) & ~run.fixed
        state = torch.where(remask, run.mask_id, torch.where(masked, x0, state))
        revealed_at = torch.where(masked & ~remask, step, revealed_at)
        return state, revealed_at

    def _scores(
        self, run: _Run, state: torch.Tensor, x0: torch.Tensor, logp: torch.Tensor, revealed: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """Log-scores (<= 0; lower is masked first): fixed positions +inf, revealed ones scaled by eta."""
        if self.score == "random":
            score = torch.rand(logp.shape, generator=run.generator, device=logp.device, dtype=logp.dtype).log()
        else:
            score = self._planned(run, state, x0, logp, revealed, vocab)
        scaled = score * self.eta if self.eta > 0 else torch.zeros_like(score)  # eta = 0: 0 * -inf is no score
        return torch.where(revealed, scaled, score).masked_fill(run.fixed, float("inf"))

    def _planned(
        self, run: _Run, state: torch.Tensor, x0: torch.Tensor, logp: torch.Tensor, revealed: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """`logp`, with the planner's log p(x0) at revealed positions; it runs (and is charged) only for rows that
        have a revealed position to judge."""
        judged = revealed.any(1)
        if run.planner is None or not judged.any():
            return logp
        proposal = self.planner_input(state, x0, run.fixed)[judged]
        kwargs = {name: value[judged] for name, value in run.kwargs.items()}
        planner_logits = without_mask(run.planner(proposal, **kwargs), run.mask_id, torch.float64)
        if planner_logits.shape != (*proposal.shape, vocab):
            raise ValueError(f"planner logits {tuple(planner_logits.shape)} do not match the denoiser's vocabulary "
                             f"({vocab}) and the sequences {tuple(proposal.shape)}")
        run.counter.charge(run.rows[judged], run.planner_share, "planner")
        planned = planner_logits.log_softmax(-1).gather(-1, x0[judged][..., None]).squeeze(-1)
        logp = logp.clone()
        logp[judged] = torch.where(revealed[judged], planned, logp[judged])
        return logp

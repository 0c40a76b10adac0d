"""Self-speculative sampling of a hybrid MDM ("Self-Speculative Masked Diffusions", Alg. 2; Alg. 3 in full).

Each step is one trunk pass, which orders the masked positions (σ), drafts them all and takes a window; up to
`inner_loops` causal passes verify the window by speculative sampling, so each decided token is an exact draw from
the causal target (Lemma C.1). Cost (§5.1): a trunk pass with its first causal pass is 1 NFE, each further causal
pass is charged at the causal blocks' share (kind "causal"). docs/samplers.md ("Self-speculative sampling").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from mdmkit.core.config import require
from mdmkit.models.denoiser import CAUSAL_HEAD, without_mask
from mdmkit.models.speculative import Trunk, gather_positions
from mdmkit.samplers.core.choice import choose_tokens, predictive_distribution
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.ordering import ERROR_PROXIES
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler

_SLACK = 1e-9  # so that a window of exactly k tokens in real arithmetic is not rounded to k + 1 or k - 1


def window_size(kind: str, param: float, masked: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Most tokens one trunk pass may reveal (Appendix D), per row, in [1, masked].

    linear: 1 + floor(param * revealed), so param = 0 reveals one token per pass.
    cosine: what a cosine-schedule MDM expects to reveal in a time step `param` from the time t at which
    it has this masked fraction m: t = 1 - 2/pi acos(m), m' = cos(pi/2 (1 - max(t - param, 0))).
    """
    masked64, total64 = masked.double(), total.double()
    if kind == "linear":
        size = 1 + torch.floor(param * (total64 - masked64) + _SLACK)
    else:
        fraction = masked64 / total64
        t = 1.0 - 2.0 / math.pi * torch.arccos(fraction.clamp(max=1.0))
        after = torch.cos(math.pi / 2 * (1.0 - (t - param).clamp(min=0.0)))
        size = torch.ceil(total64 * (fraction - after) - _SLACK)
    return torch.minimum(size.long().clamp(min=1), masked)


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """What drafts and targets are drawn from; at temperature 0 the argmax as a one-hot (greedy verification:
    a draft is kept while it is the target's argmax, and the first that is not is replaced by it)."""
    if temperature == 0.0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return predictive_distribution(logits, temperature, top_p)


def accept(draft_prob: torch.Tensor, target_prob: torch.Tensor,
           generator: torch.Generator | None) -> torch.Tensor:
    """Accept each draft with probability min(1, target_prob / draft_prob) (draft_prob > 0: it was drawn)."""
    uniform = torch.rand(draft_prob.shape, generator=generator, device=draft_prob.device,
                         dtype=draft_prob.dtype)
    return uniform * draft_prob < target_prob


def residual(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """max(0, target - draft) normalised over the last axis (the target itself where the two are equal,
    where no rejection can happen)."""
    excess = (target - draft).clamp(min=0.0)
    mass = excess.sum(-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp(min=torch.finfo(excess.dtype).tiny), target)


@dataclass
class _Pass:
    """One trunk pass over `rows`; ranks index σ, whose first `n_known` positions were not masked."""

    rows: torch.Tensor  # [R] batch rows
    trunk: Trunk | None  # None without verification
    proposal: torch.Tensor  # [R, L] the state with every masked position drafted (resampled in place)
    order: torch.Tensor  # [R, L] σ
    n_known: torch.Tensor  # [R]
    end: torch.Tensor  # [R] ranks [n_known, end) are the window
    draft: torch.Tensor  # [R, L, V] draft distribution, in σ order


@dataclass
class WindowSampler(Sampler):
    """Each trunk pass reveals the first `window` masked positions of σ from the draft: the baseline of speculative
    sampling at equal windows, with the paper's defaults. `window_param` is the linear window's slope or the cosine
    window's time step. The ordering reads the draft distribution, never the drafted tokens, so verification stays
    exact for every ordering."""

    window: Literal["linear", "cosine"] = "cosine"
    window_param: float = 0.083  # cosine: ~1/12 of the time per trunk pass
    ordering: str = "random"  # random (paper) | confidence | entropy | margin (model-guided, from the draft)
    temperature: float = 1.0  # 0: greedy verification (keep drafts while they are the target's argmax)
    top_p: float = 1.0
    stop_early: bool = True

    def validate(self) -> None:
        if self.window == "cosine":
            require(0.0 < self.window_param <= 1.0,
                    f"window_param={self.window_param}: a cosine window's time step must lie in (0, 1]")
        else:
            require(self.window_param >= 0.0,
                    f"window_param={self.window_param}: a linear window's slope must be >= 0")
        require(self.ordering in ERROR_PROXIES,
                f"ordering='{self.ordering}' is not one of {', '.join(ERROR_PROXIES)}")
        require(self.temperature >= 0.0, f"temperature={self.temperature} must be >= 0")
        require(0.0 < self.top_p <= 1.0, f"top_p={self.top_p} must lie in (0, 1]")

    def fill(self, network: ForwardCounter, canvas: Canvas) -> Sampled:
        """Fill every `mask_id` position of `tokens` [B, L]; a step is one trunk pass."""
        mask_id, generator, attention_mask = canvas.mask_id, canvas.generator, canvas.attention_mask
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("window and speculative sampling take unpadded batches (no attention_mask)")
        batch = Batch(network, canvas, stop_early=self.stop_early)
        total = batch.answer.sum(1)
        rank = torch.arange(batch.length, device=batch.x.device)
        for step in batch:
            drafted = self._draft(network, step.state, step.rows, total[step.rows], mask_id, generator)
            cursor = self._decide(network, drafted, mask_id, generator)
            decided = (rank[None, :] >= drafted.n_known[:, None]) & (rank[None, :] < cursor[:, None])
            batch.reveal(step, torch.zeros_like(drafted.proposal, dtype=torch.bool).scatter(1, drafted.order, decided),
                         drafted.proposal)
            batch.end(step)
        return batch.result()

    def _trunk(self, counter: ForwardCounter, state: torch.Tensor,
               rows: torch.Tensor) -> tuple[torch.Tensor, Trunk | None]:
        """The draft logits of one trunk pass (1 NFE), and what verification needs of it."""
        return counter(state, rows), None

    def _decide(self, counter: ForwardCounter, step: _Pass, mask_id: int,
                generator: torch.Generator | None) -> torch.Tensor:
        """The rank of σ up to which this pass reveals: the whole window."""
        return step.end

    def _draft(self, counter: ForwardCounter, state: torch.Tensor, rows: torch.Tensor, total: torch.Tensor,
               mask_id: int, generator: torch.Generator | None) -> _Pass:
        """The trunk pass: σ, the window and a draft for every masked position."""
        logits, trunk = self._trunk(counter, state, rows)
        logits = without_mask(logits, mask_id)
        draft = sampling_probs(logits, self.temperature, self.top_p)
        drafted, _ = choose_tokens(draft, self.temperature, generator)
        unknown = state == mask_id
        guide = predictive_distribution(logits, self.temperature, self.top_p)  # untempered at temperature 0
        error = ERROR_PROXIES[self.ordering](guide, guide.max(-1).values, generator)
        order = error.masked_fill(~unknown, float("-inf")).argsort(dim=1, stable=True)
        n_masked = unknown.sum(1)
        n_known = state.shape[1] - n_masked
        end = n_known + window_size(self.window, self.window_param, n_masked, total)
        return _Pass(rows, trunk, torch.where(unknown, drafted, state), order, n_known, end,
                     gather_positions(draft, order))


@dataclass
class SpeculativeSampler(WindowSampler):
    """Self-speculative sampling: each window is verified by up to `inner_loops` causal passes per trunk pass
    (needs a `SpeculativeTransformer`)."""

    inner_loops: int = 1  # draft-verify loops per non-causal pass

    requires: ClassVar[frozenset[str]] = frozenset({CAUSAL_HEAD})

    def validate(self) -> None:
        super().validate()
        require(self.inner_loops >= 1, f"inner_loops={self.inner_loops} must be >= 1")

    def _trunk(self, counter: ForwardCounter, state: torch.Tensor,
               rows: torch.Tensor) -> tuple[torch.Tensor, Trunk | None]:
        trunk = counter.noncausal(state, rows)
        return trunk.logits, trunk

    def _decide(self, counter: ForwardCounter, step: _Pass, mask_id: int,
                generator: torch.Generator | None) -> torch.Tensor:
        """The draft-verify inner loops of one trunk pass. Accepted drafts stay in `step.proposal`, resampled
        tokens are written into it."""
        assert step.trunk is not None, "a verifying sampler keeps its trunk pass"
        length = step.proposal.shape[1]
        rank = torch.arange(length, device=step.proposal.device)
        # a window of σ(n_known) alone needs no causal pass: its target is its draft, always kept
        alone = step.end - step.n_known == 1
        cursor = torch.where(alone, step.end, step.n_known)
        for loop in range(self.inner_loops):
            live = (cursor < step.end).nonzero().squeeze(1)
            if live.numel() == 0:
                break
            order, draft = step.order[live], step.draft[live]
            # the first causal pass is part of the trunk pass's NFE
            logits = counter.causal(step.rows[live], step.trunk.select(live), step.proposal[live], order,
                                    step.n_known[live], charged=loop > 0)
            target = sampling_probs(without_mask(logits, mask_id), self.temperature, self.top_p)
            target = gather_positions(target, order)
            drafted = step.proposal[live].gather(1, order)[..., None]
            kept = accept(draft.gather(-1, drafted)[..., 0], target.gather(-1, drafted)[..., 0], generator)
            in_play = (rank[None, :] >= cursor[live, None]) & (rank[None, :] < step.end[live, None])
            first_rejected = torch.where(in_play & ~kept, rank, length).min(1).values
            rejected = (first_rejected < step.end[live]).nonzero().squeeze(1)
            if rejected.numel():
                at = first_rejected[rejected]
                fresh = residual(draft[rejected, at], target[rejected, at])
                token, _ = choose_tokens(fresh, self.temperature, generator)
                step.proposal[live[rejected], order[rejected, at]] = token
            cursor[live] = torch.minimum(first_rejected + 1, step.end[live])
        return cursor

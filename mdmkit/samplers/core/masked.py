"""The batched masked-sampling loop: ordering x budget x choice.

Each step the sampler draws a token for each eligible masked position (choice), sorts them by an error proxy
(ordering) and reveals a per-row number of the best (budget); a finished row leaves the batch. `block_length`
restricts eligibility to semi-autoregressive blocks, which `cache=prefix|dual` decodes against an approximate KV
cache (kv_cache.py). Rules across steps hook in through a `StepRule`: the sampler's own or a wrapper's (`fill_with`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar

import torch

from mdmkit.core.config import require
from mdmkit.models.denoiser import without_mask
from mdmkit.samplers.core.blocks import cache_requirements, check_cache_fields, check_sampling_fields, eligible_span
from mdmkit.samplers.core.budget import Budget, Ranked
from mdmkit.samplers.core.choice import choose_tokens, predictive_distribution
from mdmkit.samplers.core.counting import CountedNetwork
from mdmkit.samplers.core.driver import Batch
from mdmkit.samplers.core.kv_cache import CacheMode
from mdmkit.samplers.core.ordering import ERROR_PROXIES, ErrorProxy, entropy
from mdmkit.samplers.core.protocol import Canvas, Sampled, Sampler


class _LazyRanked(Ranked):
    """Ranked view whose entropies are computed only if a budget rule reads them."""

    def __init__(self, probs: torch.Tensor, order: torch.Tensor, **fields: Any) -> None:
        self._probs, self._order = probs, order
        for name, value in fields.items():
            setattr(self, name, value)

    @cached_property
    def entropy(self) -> torch.Tensor:  # type: ignore[override]  # Ranked's field, computed when first read
        return entropy(self._probs).gather(1, self._order)


class StepRule:
    """The state, for one `fill`, of a rule that reads every step's predictions (KLASS, Credit, Prophet, NI).

    Each hook sees the step's batch rows `rows` [R] and keeps memory per batch row and position, updated only for
    `rows`; `span` is the columns the step computes, `candidates` [R, S] the positions the budget may reveal there.
    The defaults change nothing.
    """

    needs_hidden = False  # `also` reads the last hidden state (the `hidden_states` capability; no KV cache)
    reads_canvas = False  # `commit` or `also` read every column's logits (else the step computes its span's only)
    # a revising rule (`revise`): a row takes up to this many steps more on its block once full (core/editing.py)
    post_steps: int | None = None

    def __init__(self, answer: torch.Tensor) -> None:
        columns = answer.any(0).nonzero()  # memory covers the columns of the answer positions only
        self.first = int(columns[0]) if columns.numel() else 0
        self.width = int(columns[-1]) + 1 - self.first if columns.numel() else 0

    def columns(self, span: slice) -> slice:
        """The memory columns of the canvas columns `span` (the step's columns are always answer columns)."""
        return slice(span.start - self.first, span.stop - self.first)

    def commit(self, rows: torch.Tensor, logits: torch.Tensor, masked: torch.Tensor) -> torch.Tensor | None:
        """Bool [R]: rows that reveal every masked position now, past their block (`logits` [R, L, V] the whole
        canvas's, as the network returned them; `masked` [R, L]). None: no row."""
        return None

    def fuse(self, rows: torch.Tensor, span: slice, logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """The logits [R, S, V] (the mask token at -inf) the step's choice and scores are read from."""
        return logits

    def pick(self, rows: torch.Tensor, span: slice, probs: torch.Tensor, chosen_prob: torch.Tensor,
             candidates: torch.Tensor) -> torch.Tensor | None:
        """Bool [R, S]: the positions to reveal instead of the budget's, in the rows where any is set (the budget
        decides the others); None: the budget everywhere."""
        return None

    def also(self, rows: torch.Tensor, state: torch.Tensor, logits: torch.Tensor,
             hidden: torch.Tensor | None) -> torch.Tensor | None:
        """Bool [R, L]: eligible positions to reveal beyond what the step reveals (`state` [R, L] the rows'
        canvas, `logits` [R, L, V] every column's as the network returned them, `hidden` the last hidden state
        of the same forward where `needs_hidden`). None: none."""
        return None

    def revise(self, rows: torch.Tensor, span: slice, state: torch.Tensor, choice: torch.Tensor,
               chosen_prob: torch.Tensor, editable: torch.Tensor) -> torch.Tensor | None:
        """Bool [R, S]: decided positions of the block (`editable`, all [R, S] over `span`, as the step's `state`,
        `choice` and its probability) that take the step's choice (a revising rule, `post_steps` set). None: none."""
        return None


class StepRules(StepRule):
    """Several rules on one loop: logits pass through each in turn, a later rule's picks and commits win."""

    def __init__(self, *rules: StepRule) -> None:
        self.rules = rules
        self.needs_hidden = any(rule.needs_hidden for rule in rules)
        self.reads_canvas = any(rule.reads_canvas for rule in rules)
        limits = [rule.post_steps for rule in rules if rule.post_steps is not None]
        self.post_steps = max(limits) if limits else None

    @staticmethod
    def of(*rules: StepRule | None) -> StepRule | None:
        """The given rules as one (None: none given)."""
        given = [rule for rule in rules if rule is not None]
        return None if not given else given[0] if len(given) == 1 else StepRules(*given)

    def commit(self, rows: torch.Tensor, logits: torch.Tensor, masked: torch.Tensor) -> torch.Tensor | None:
        commits = [c for c in (rule.commit(rows, logits, masked) for rule in self.rules) if c is not None]
        return torch.stack(commits).any(0) if commits else None

    def fuse(self, rows: torch.Tensor, span: slice, logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        for rule in self.rules:
            logits = rule.fuse(rows, span, logits, candidates)
        return logits

    def pick(self, rows: torch.Tensor, span: slice, probs: torch.Tensor, chosen_prob: torch.Tensor,
             candidates: torch.Tensor) -> torch.Tensor | None:
        picked = None
        for rule in self.rules:
            mine = rule.pick(rows, span, probs, chosen_prob, candidates)
            if mine is not None:
                picked = mine if picked is None else torch.where(mine.any(1, keepdim=True), mine, picked)
        return picked

    def also(self, rows: torch.Tensor, state: torch.Tensor, logits: torch.Tensor,
             hidden: torch.Tensor | None) -> torch.Tensor | None:
        extra = [e for e in (rule.also(rows, state, logits, hidden) for rule in self.rules) if e is not None]
        return torch.stack(extra).any(0) if extra else None

    def revise(self, rows: torch.Tensor, span: slice, state: torch.Tensor, choice: torch.Tensor,
               chosen_prob: torch.Tensor, editable: torch.Tensor) -> torch.Tensor | None:
        edits = [e for e in (rule.revise(rows, span, state, choice, chosen_prob, editable) for rule in self.rules)
                 if e is not None]
        return torch.stack(edits).any(0) if edits else None


def _from_fields(rule: type, sampler: Any) -> Any:
    """The rule dataclass `rule` built from the sampler's fields of the same names (it checks their ranges)."""
    return rule(**{field.name: getattr(sampler, field.name) for field in fields(rule)})


@dataclass
class MaskedSampler(Sampler):
    """The shared loop; fields are the ordering and choice knobs. A subclass names its budget rule (a dataclass,
    budget.py) in `budget_rule` and declares its fields under the same names, or overrides `budget()`."""

    budget_rule: ClassVar[type[Budget] | None] = None
    step_rule: ClassVar[type | None] = None  # a rule across steps: a dataclass whose `start(answer)` is a StepRule
    # Dream's own schedule detail, a field of DreamStepsSampler only (here: the loop's default)
    empty_steps = False  # a step whose budget is 0 reveals nothing (else every step reveals at least one)

    ordering: str | Callable[..., torch.Tensor] = "confidence"  # confidence | entropy | margin | random | a callable
    temperature: float = 0.0
    top_p: float = 1.0
    block_length: int | None = None  # semi-autoregressive blocks over the answer positions (None: one block)
    stop_early: bool = True  # with a stop condition: finished rows stop computing (else only the point is noted)
    cache: CacheMode = "none"  # none | prefix | dual: Fast-dLLM's approximate KV caches, refreshed per block
    cache_refresh: int | None = None  # with a cache: also refresh every n steps inside a block (None: never)
    # scores (confidence, margin, entropy) from the softmax over every token, the mask token included, as the
    # official LLaDA, Fast-dLLM and Dream code computes them; the chosen token is never the mask either way
    mask_in_softmax: bool = False

    @property
    def requires(self) -> frozenset[str]:
        return cache_requirements(self.cache)

    def validate(self) -> None:
        if isinstance(self.ordering, str):
            require(self.ordering in ERROR_PROXIES,
                    f"ordering='{self.ordering}' is not one of {', '.join(ERROR_PROXIES)}")
        else:
            require(callable(self.ordering), "ordering must be a name or a callable error proxy")
        check_sampling_fields(self.temperature, self.top_p, self.block_length)
        check_cache_fields(self.cache, self.cache_refresh, self.block_length)
        if self.budget_rule is not None:
            self.budget()  # the rule checks its own fields: a bad value stops at construction
        if self.step_rule is not None:
            _from_fields(self.step_rule, self)

    def budget(self) -> Budget:
        """This sampler's budget rule, built from the fields it shares with the rule."""
        if self.budget_rule is None:
            raise NotImplementedError(f"{type(self).__name__} sets no budget_rule and does not override budget()")
        return _from_fields(self.budget_rule, self)

    def rule(self, answer: torch.Tensor) -> StepRule | None:
        """This sampler's rule across steps for a batch whose positions to fill are `answer` [B, L] (None: none)."""
        return None if self.step_rule is None else _from_fields(self.step_rule, self).start(answer)

    def error_proxy(self) -> ErrorProxy:
        return ERROR_PROXIES[self.ordering] if isinstance(self.ordering, str) else self.ordering

    def _span(self, eligible: torch.Tensor) -> slice:
        return slice(0, eligible.shape[1]) if self.ordering == "random" else eligible_span(eligible)

    def fill(self, network: CountedNetwork, canvas: Canvas) -> Sampled:
        """The shared loop (see `Sampler.sample`)."""
        return self.fill_with(network, canvas, None)

    def fill_with(self, network: CountedNetwork, canvas: Canvas, rule: StepRule | None) -> Sampled:
        """The shared loop with a wrapper's `rule` after this sampler's own (Prophet's early commit, NI's
        indicator)."""
        mask_id, generator = canvas.mask_id, canvas.generator
        rule = StepRules.of(self.rule(canvas.tokens == mask_id), rule)
        needs_hidden = rule is not None and rule.needs_hidden
        require(not needs_hidden or self.cache == "none",
                f"a rule that reads hidden states needs full forwards: cache={self.cache} must be none")
        post_steps = None if rule is None else rule.post_steps  # a revising rule: its edits span the whole block
        batch = Batch(network, canvas, stop_early=self.stop_early, block_length=self.block_length, cache=self.cache,
                      cache_refresh=self.cache_refresh, post_steps=post_steps)
        budget, proxy = self.budget(), self.error_proxy()
        columns = torch.arange(batch.length, device=batch.x.device)
        for step in batch:
            # the step's math runs on the columns some row may reveal (a text answer, or its block: not the prompt),
            # and so does the network's output layer, unless a rule reads every column; the random order draws one
            # uniform per canvas position, as Dream's code does, so it keeps every column
            eligible = step.eligible
            span = self._span(eligible if post_steps is None else step.in_block)
            narrow = rule is None or not rule.reads_canvas
            if needs_hidden:
                logits, hidden = batch.logits_and_hidden(step)
            else:
                logits, hidden = batch.logits(step, span if narrow else None), None
            full, commit = logits, None
            if rule is not None and not narrow:
                commit = rule.commit(step.rows, logits, step.masked)
                if commit is not None:  # these rows reveal every masked position now, past their block
                    eligible = eligible | (commit[:, None] & step.masked)
                    span = self._span(eligible if post_steps is None else eligible | step.in_block)
                logits = logits[:, span]
            candidates = eligible[:, span]
            raw = logits.float()
            logits = without_mask(raw, mask_id)
            if rule is not None:
                logits = rule.fuse(step.rows, span, logits, candidates)
            probs = predictive_distribution(logits, self.temperature, self.top_p)
            choice, chosen_prob = choose_tokens(probs, self.temperature, generator)
            if self.mask_in_softmax:  # the chosen token is still never the mask; only the scores change
                probs = predictive_distribution(raw, self.temperature, self.top_p)
                chosen_prob = probs.gather(-1, choice[..., None]).squeeze(-1)
            del raw
            error = proxy(probs, chosen_prob, generator).masked_fill(~candidates, float("inf"))
            order = error.argsort(dim=1, stable=True)
            n_eligible = candidates.sum(1)
            ranks = columns[: order.shape[1]]
            ranked = _LazyRanked(
                probs, order,
                confidence=chosen_prob.gather(1, order).masked_fill(ranks >= n_eligible[:, None], 0.0),
                n_eligible=n_eligible, step_in_block=step.in_block_steps, block_size=step.block_size,
                error=error.gather(1, order),
            )
            counts = torch.minimum(budget(ranked).clamp(min=0 if self.empty_steps else 1), n_eligible)
            reveal = torch.zeros_like(candidates).scatter(1, order, ranks[None, :] < counts[:, None])
            picked = None if rule is None else rule.pick(step.rows, span, probs, chosen_prob, candidates)
            if picked is not None:
                reveal = torch.where(picked.any(1, keepdim=True), picked & candidates, reveal)
            if commit is not None:
                reveal = torch.where(commit[:, None], candidates, reveal)
            extra = None if rule is None or narrow else rule.also(step.rows, step.state, full, hidden)
            if extra is not None:
                reveal |= (extra & eligible)[:, span]
            edits = None if rule is None else rule.revise(step.rows, span, step.state[:, span], choice, chosen_prob,
                                                          (step.in_block & ~step.masked)[:, span])
            if edits is not None:
                reveal |= edits
            batch.reveal(step, reveal, choice, span)
            batch.end(step, changed=None if edits is None else edits.any(1))
        return batch.result()

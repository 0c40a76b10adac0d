"""The oracle floor: the fewest forward passes that reproduce a reference trajectory exactly.

Given the final tokens x* and the ordered partition A_1..A_n of a reference run, an oracle that knows x* may
merge consecutive steps without changing the output: from the state after A_1..A_k it always reveals A_{k+1}
(the reference's own next step) and then every following step, in order, whose positions the network's argmax
already gets right. It stops at the first step with a wrong position, even if later steps are right (the order
constraint: revealing past an unfinished step would change the states the remaining steps see). Every state
the oracle visits is a state of the reference trajectory, so the output is unchanged; the pass count is the
NFE floor of any trajectory-preserving sampler, and the merged groups are the NI-sampling labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mdmkit.models.denoiser import without_mask
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.protocol import Sampled


@dataclass
class OracleMerge:
    """The oracle's schedule: per row the passes it took and which pass revealed each reference step."""

    nfe: torch.Tensor  # [B] forward passes per row (the floor)
    step_pass: torch.Tensor  # [B, S] pass (0-based) that revealed reference step s, -1 past the row's steps

    def groups(self, row: int) -> list[list[int]]:
        """Row `row`'s merged partition: the reference step indices revealed together at each pass."""
        passes = self.step_pass[row]
        return [torch.nonzero(passes == p).flatten().tolist() for p in range(int(self.nfe[row]))]


def _check_reference(prompts: torch.Tensor, reference: Sampled, mask_id: int) -> None:
    """The reference must extend the prompts: it only reveals masked positions and keeps the given ones."""
    if prompts.shape != reference.tokens.shape:
        raise ValueError(f"prompts {tuple(prompts.shape)} and reference {tuple(reference.tokens.shape)} differ")
    revealed = reference.reveal_step >= 0
    if (revealed & (prompts != mask_id)).any():
        raise ValueError("the reference reveals a position the prompt already gives")
    if ((prompts != mask_id) & (reference.tokens != prompts)).any():
        raise ValueError("the reference changes a given prompt token")
    if (reference.reveal_step >= reference.steps[:, None]).any():
        raise ValueError("a reveal step lies beyond its row's step count")
    if (revealed & (reference.tokens == mask_id)).any():
        raise ValueError("the reference reveals the mask token")


@torch.no_grad()
def oracle_merge(
    network: Callable[..., torch.Tensor],
    prompts: torch.Tensor,
    reference: Sampled,
    mask_id: int,
    batch_size: int | None = None,
) -> OracleMerge:
    """Run the oracle on every row of `prompts` [B, L] against `reference` (see the module). A row leaves the batch
    once all its steps are revealed, so it is charged exactly the passes it needs; `batch_size` caps a call's rows."""
    _check_reference(prompts, reference, mask_id)
    device = prompts.device
    target, reveal_step = reference.tokens.to(device), reference.reveal_step.to(device)
    n_steps = reference.steps.to(device)
    batch = prompts.shape[0]
    max_steps = int(n_steps.max()) if batch else 0
    step_ids = torch.arange(max_steps, device=device)
    counter = ForwardCounter(network, batch)
    done = torch.zeros(batch, dtype=torch.long, device=device)  # reference steps revealed so far (k)
    passes = torch.zeros_like(done)
    step_pass = torch.full((batch, max_steps), -1, dtype=torch.long, device=device)
    chunk = batch_size or max(batch, 1)
    # only positions of steps after k can stop a merge: given positions (-1), positions the reference left
    # masked (-1) and already revealed ones never do
    never = torch.iinfo(torch.long).max

    while True:
        active = (done < n_steps).nonzero().squeeze(1)
        if active.numel() == 0:
            break
        for rows in active.split(chunk):
            k = done[rows]
            steps_here = reveal_step[rows]
            shown = (steps_here >= 0) & (steps_here < k[:, None])
            state = torch.where(shown, target[rows], prompts[rows])
            logits = counter(state, rows).float()
            predicted = without_mask(logits, mask_id).argmax(-1)
            # first step after k (the always-revealed one) holding a wrong position; none: the row's end
            wrong_later = (predicted != target[rows]) & (steps_here > k[:, None])
            first_wrong = torch.where(wrong_later, steps_here, never).amin(1)
            new_k = torch.minimum(first_wrong, n_steps[rows])
            merged = (step_ids >= k[:, None]) & (step_ids < new_k[:, None])
            step_pass[rows] = torch.where(merged, passes[rows, None], step_pass[rows])
            done[rows] = new_k
            passes[rows] += 1

    nfe = counter.nfe.to(device)
    if not torch.equal(nfe, passes) or (passes > n_steps).any() or ((passes == 0) != (n_steps == 0)).any():
        raise RuntimeError("oracle bookkeeping disagrees with the forward-pass counter")
    return OracleMerge(nfe, step_pass)


def oracle_floor(
    network: Callable[..., torch.Tensor],
    prompts: torch.Tensor,
    reference: Sampled,
    mask_id: int,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Per-row minimal NFE [B] (long) of a trajectory-preserving sampler reproducing `reference` exactly."""
    return oracle_merge(network, prompts, reference, mask_id, batch_size).nfe


def oracle_groups(
    network: Callable[..., torch.Tensor],
    prompts: torch.Tensor,
    reference: Sampled,
    mask_id: int,
    row: int,
) -> list[list[int]]:
    """Row `row`'s merged partition: the groups of reference step indices the oracle reveals per pass."""
    one = slice(row, row + 1)
    single = Sampled(reference.tokens[one], reference.reveal_step[one], reference.steps[one])
    return oracle_merge(network, prompts[one], single, mask_id).groups(0)

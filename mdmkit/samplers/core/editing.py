"""Revision: the bookkeeping that lets a step-by-step sampler rewrite tokens it has already decided.

Every other sampler treats a revealed token as final. A revising rule (LLaDA2.1's token editing, rules/editing.py)
may rewrite the decided tokens of a row's current block at any step. Once that block holds no mask, the row takes up
to `limit` more forwards on it ("post steps") and leaves it at the first that changes nothing, as LLaDA2.1's
generate does. Each post step is a forward like any other, charged to its row, so NFE counts them. Until its block
is closed a row's tokens there may still change, so a stop condition reads them as masked (rows stop only on text
that is final).
"""

from __future__ import annotations

import torch


class PostSteps:
    """Per batch row: whether its current block is full and open for post steps, and how many it has taken."""

    def __init__(self, limit: int, batch: int, device: torch.device) -> None:
        self.limit = limit
        self.open = torch.zeros(batch, dtype=torch.bool, device=device)
        self.taken = torch.zeros(batch, dtype=torch.long, device=device)

    def keep_blocks(self, rows: torch.Tensor, in_block: torch.Tensor, entered: torch.Tensor, previous: torch.Tensor,
                    row_block: torch.Tensor, current_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows` whose block is open stay in it (`previous` [R]: their block before this step chose the next one;
        `row_block` [R, L] each position's block; `current_block` [B] is put back for them)."""
        stay = self.open[rows]
        if not bool(stay.any()):
            return in_block, entered
        current_block[rows] = torch.where(stay, previous, current_block[rows])
        in_block = torch.where(stay[:, None], row_block == previous[:, None], in_block)
        return in_block, entered & ~stay

    def end(self, rows: torch.Tensor, had_mask: torch.Tensor, full: torch.Tensor,
            changed: torch.Tensor) -> torch.Tensor:
        """After a step of `rows` (each [R]: the step started with a mask in the block, the block holds none now,
        the step rewrote a decided token): which rows' blocks are closed, their tokens final."""
        post = ~had_mask
        taken = self.taken[rows] + post.long()
        goes_on = full & torch.where(post, changed & (taken < self.limit), self.limit > 0)
        self.open[rows] = goes_on
        self.taken[rows] = torch.where(goes_on, taken, 0)
        return full & ~goes_on


def token_edits(choice: torch.Tensor, chosen_prob: torch.Tensor, state: torch.Tensor, editable: torch.Tensor,
                threshold: float) -> torch.Tensor:
    """Bool [R, S]: the decided positions (`editable`) whose token the step's choice replaces: it differs from the
    token there and its probability is above `threshold` (strictly, as LLaDA2.1's T2T rule; 1 or more: none)."""
    return editable & (choice != state) & (chosen_prob > threshold)

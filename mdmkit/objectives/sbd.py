"""Next-token prediction and Set Block Decoding (SBD) losses for a causal transformer.

SBD (Gat et al. 2025, eq. 14) trains one network for two uses. The input is 2L tokens: the clean sequence
(causal attention, next-token targets) followed by a noisy copy in which answer tokens are masked with
probability eta ~ U(0, 1) per sequence. The copy is cut into blocks of k: each noisy block attends
bidirectionally within itself and to the clean tokens of earlier blocks, and predicts its own masked tokens.
Both halves share position ids, so noisy token i sits exactly where clean token i does: at inference a block
of masks after a cached prefix is the same computation (see `mdmkit.samplers.rules.sbd`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from mdmkit.core.config import Validated, require

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [L, L], True where query i may attend to key j (j <= i)."""
    index = torch.arange(length, device=device)
    return index[None, :] <= index[:, None]


def _sbd_rule(q: torch.Tensor, kv: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """The attention rule of the 2L layout on index tensors (shared by the dense mask and FlexAttention)."""
    q_noisy, kv_noisy = q >= length, kv >= length
    clean_causal = ~q_noisy & ~kv_noisy & (kv <= q)
    same_block = q_noisy & kv_noisy & ((q - length) // block == (kv - length) // block)
    earlier_clean = q_noisy & ~kv_noisy & (kv // block < (q - length) // block)
    return clean_causal | same_block | earlier_clean


def sbd_attention_mask(length: int, block: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [2L, 2L] for the clean + noisy layout with blocks of `block` (paper Figure 8)."""
    require(block >= 1, f"block size {block} must be >= 1")
    index = torch.arange(2 * length, device=device)
    return _sbd_rule(index[:, None], index[None, :], length, block)


def sbd_block_mask(length: int, block: int, device: torch.device | str = "cpu") -> BlockMask:
    """The same rule as a FlexAttention BlockMask (for GPUs; FlexAttention has no CPU backward)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def rule(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return _sbd_rule(q, kv, length, block)

    return create_block_mask(rule, B=None, H=None, Q_LEN=2 * length, KV_LEN=2 * length, device=device)


Terms = tuple[torch.Tensor, torch.Tensor]
Network = Callable[..., torch.Tensor]


def _ce(logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor) -> Terms:
    """Mean cross-entropy and accuracy over positions `where`."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), targets, reduction="none")
    count = where.sum().clamp(min=1)
    with torch.no_grad():
        accuracy = ((logits.argmax(-1) == targets) & where).sum() / count
    return (ce * where).sum() / count, accuracy


def next_token_terms(logits: torch.Tensor, tokens: torch.Tensor, answer_mask: torch.Tensor) -> Terms:
    """NTP cross-entropy and accuracy: position t predicts token t+1, scored where t+1 is an answer token."""
    return _ce(logits[:, :-1], tokens[:, 1:], answer_mask[:, 1:])


@dataclass
class NextTokenLoss(Validated):
    """Plain next-token prediction on the answer tokens (the NTP model SBD starts from, and its baseline)."""

    def __call__(self, network: Network, tokens: torch.Tensor, answer_mask: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        logits = network(tokens, attn_mask=causal_mask(tokens.shape[1], tokens.device))
        loss, accuracy = next_token_terms(logits, tokens, answer_mask)
        return loss, {"ntp_ce": loss.detach(), "ntp_acc": accuracy, "masked_acc": accuracy}


@dataclass
class SBDLoss(Validated):
    """NTP on the clean half + masked prediction on the noisy half (eq. 14), each a mean over its tokens. k is drawn
    uniformly from `block_size` [lo, hi] per step; `ntp_term=False` is the paper's ablation (Figure 4: NTP logged,
    no gradient); `attention` is `flex` (FlexAttention, GPU), `sdpa` (a bool mask, any device) or `auto`."""

    block_size: tuple[int, int] = (2, 16)  # k drawn uniformly per step from [lo, hi] (the paper's range)
    ntp_term: bool = True  # False: the paper's ablation (NTP logged, no gradient)
    # flex (FlexAttention, GPU) | sdpa (explicit mask, any device) | auto
    attention: Literal["auto", "sdpa", "flex"] = "auto"

    def validate(self) -> None:
        lo, hi = self.block_size
        require(1 <= lo <= hi, f"block_size={list(self.block_size)} must satisfy 1 <= lo <= hi")

    def draw_block(self, generator: torch.Generator | None, device: torch.device) -> int:
        lo, hi = self.block_size
        return int(torch.randint(lo, hi + 1, (1,), generator=generator, device=device))

    def mask_for(self, length: int, block: int, device: torch.device) -> Any:
        use_flex = self.attention == "flex" or (self.attention == "auto" and device.type == "cuda")
        build = sbd_block_mask if use_flex else sbd_attention_mask
        return build(length, block, device)

    def __call__(self, network: Network, tokens: torch.Tensor, answer_mask: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        batch, length = tokens.shape
        device = tokens.device
        block = self.draw_block(generator, device)
        eta = torch.rand(batch, 1, generator=generator, device=device)
        masked = (torch.rand(tokens.shape, generator=generator, device=device) < eta) & answer_mask
        noisy = torch.where(masked, mask_id, tokens)
        positions = torch.arange(length, device=device).repeat(2)[None].expand(batch, -1)
        logits = network(torch.cat([tokens, noisy], 1), attn_mask=self.mask_for(length, block, device),
                         positions=positions)
        ntp, ntp_acc = next_token_terms(logits[:, :length], tokens, answer_mask)
        matp, matp_acc = _ce(logits[:, length:], tokens, masked)
        loss = matp + (ntp if self.ntp_term else 0.0)
        metrics = {"ntp_ce": ntp.detach(), "ntp_acc": ntp_acc, "matp_ce": matp.detach(),
                   "masked_acc": matp_acc, "block_size": torch.tensor(float(block))}
        return loss, metrics

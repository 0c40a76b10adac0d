"""The network is bidirectional and time-agnostic; the loss only ever touches masked answer positions."""

from __future__ import annotations

import pytest
import torch
from fakes import random_transformer

from mdmkit.objectives import MaskedDiffusionLoss

MASK = 9


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_transformer_is_bidirectional(positions: str) -> None:
    net = random_transformer(10, 12, positions=positions)
    tokens = torch.randint(0, 9, (2, 12))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 9
    out, out_changed = net(tokens), net(changed)
    assert out.shape == (2, 12, 10)
    assert not torch.allclose(out[:, 0], out_changed[:, 0])  # the first position sees the last one


def test_positions_matter() -> None:
    net = random_transformer(10, 8, n_layers=1, d_model=16)
    tokens = torch.full((1, 8), 3)
    logits = net(tokens)
    assert not torch.allclose(logits[0, 0], logits[0, 1])


def test_too_long_input_is_a_clear_error() -> None:
    net = random_transformer(10, 4, None, n_layers=1, d_model=16)
    with pytest.raises(ValueError, match="exceeds the model's max_len=4"):
        net(torch.zeros(1, 5, dtype=torch.long))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 9, (64, 10))
    answer_mask = torch.zeros(64, 10, dtype=torch.bool)
    answer_mask[:, 3:8] = True
    return tokens, answer_mask


def test_corruption_masks_only_answer_positions_with_rate_t() -> None:
    tokens, answer_mask = _batch()
    loss = MaskedDiffusionLoss()
    c = loss.corrupt(tokens, answer_mask, MASK, torch.Generator().manual_seed(0))
    assert not c.masked[~answer_mask].any()
    assert torch.equal(c.noisy[~c.masked], tokens[~c.masked])
    assert (c.noisy[c.masked] == MASK).all()
    assert ((c.t >= 1e-3) & (c.t <= 1)).all()
    big_tokens = torch.zeros(4000, 50, dtype=torch.long)
    everywhere = torch.ones_like(big_tokens, dtype=torch.bool)
    big = loss.corrupt(big_tokens, everywhere, MASK, torch.Generator().manual_seed(1))
    rate = big.masked.float().mean(1)
    assert torch.allclose(rate, big.t, atol=0.25)
    assert abs(float((rate - big.t).mean())) < 0.01  # each position masked with probability t


@pytest.mark.parametrize("weighting", ["elbo", "uniform"])
def test_loss_gradient_only_on_masked_answer_positions(weighting: str) -> None:
    tokens, answer_mask = _batch()
    logits = torch.randn(64, 10, 10, requires_grad=True)
    objective = MaskedDiffusionLoss(weighting=weighting)
    loss, _ = objective(lambda noisy: logits, tokens, answer_mask, MASK, torch.Generator().manual_seed(0))
    loss.backward()
    c = objective.corrupt(tokens, answer_mask, MASK, torch.Generator().manual_seed(0))  # same draws
    touched = logits.grad.abs().sum(-1) > 0
    assert torch.equal(touched, c.masked)


def test_weightings_match_their_formulas() -> None:
    tokens, answer_mask = _batch()
    logits = torch.randn(64, 10, 10)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")
    for weighting in ("elbo", "uniform"):
        objective = MaskedDiffusionLoss(weighting=weighting)
        loss, _ = objective(lambda noisy: logits, tokens, answer_mask, MASK, torch.Generator().manual_seed(0))
        c = objective.corrupt(tokens, answer_mask, MASK, torch.Generator().manual_seed(0))
        if weighting == "elbo":
            expected = ((ce * c.masked).sum(1) / c.t / answer_mask.sum(1)).mean()
        else:
            expected = (ce * c.masked).sum() / c.masked.sum()
        assert torch.allclose(loss, expected)

"""Uniform-noise diffusion with self-conditioning on mdmkit's own network: the corruption's marginal, the loss against
its formula, self-conditioning's two passes, the in-place canvas the revisable sampler runs (givens kept, rules and
the stop over the positions to fill), a tiny network trained here decoding end to end, and the masked path untouched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.evaluation.generation import check_trained_for
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.models import MaskedTransformer, SelfConditionedConfig, SelfConditionedTransformer
from mdmkit.models.self_conditioned import pin_givens
from mdmkit.objectives import MaskedDiffusionLoss, UniformDiffusionLoss
from mdmkit.objectives.uniform_diffusion import uniform_corrupt
from mdmkit.samplers import EBSampler, ForwardCounter, RevisableSampler, ThresholdSampler, TopKSampler
from mdmkit.samplers.core.canvas import Draw
from mdmkit.samplers.rules.revisable import acceptance

ROOT = Path(__file__).resolve().parents[1]
VOCAB, MASK = 5, 4  # tokens 0..3 and a mask id


def tiny(seed: int = 0, length: int = 6) -> SelfConditionedTransformer:
    torch.manual_seed(seed)
    return SelfConditionedConfig(VOCAB, length, d_model=32, n_heads=2, n_layers=2).build()


def copy_batch(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy task: three given tokens, then the same three to fill."""
    head = torch.randint(0, 4, (rows, 3), generator=generator)
    answer = torch.zeros(rows, 6, dtype=torch.bool)
    answer[:, 3:] = True
    return torch.cat([head, head], 1), answer


def test_corruption_marginal_and_positions() -> None:
    """q(x_t = v | x_0) = (1 - t) [v = x_0] + t / V at answer positions, givens untouched; the positions hit are
    the masked objective's for the same seed."""
    rows, vocab = 40000, 3
    tokens = torch.zeros(rows, 2, dtype=torch.long)
    answer = torch.tensor([[False, True]]).expand(rows, -1)
    c = uniform_corrupt(tokens, answer, vocab, 1e-3, True, torch.Generator().manual_seed(1))
    hit = MaskedDiffusionLoss().corrupt(tokens, answer, MASK, torch.Generator().manual_seed(1))
    assert torch.equal(c.masked, hit.masked) and torch.equal(c.t, hit.t)
    assert bool((c.noisy[:, 0] == 0).all()) and bool((c.noisy[~c.masked] == 0).all())
    for value in range(vocab):
        expected = float(((1 - c.t) * (value == 0) + c.t / vocab).mean())
        observed = float((c.noisy[:, 1] == value).float().mean())
        assert abs(observed - expected) < 4 * (expected * (1 - expected) / rows) ** 0.5


def test_corruption_enumerated_at_fixed_rate() -> None:
    """At t = 1 every answer position is a uniform draw: over many draws each of V values comes up 1/V of the time."""
    loss = UniformDiffusionLoss(t_min=0.999999, stratified=False)
    tokens = torch.full((30000, 1), 2)
    c = uniform_corrupt(tokens, torch.ones_like(tokens, dtype=torch.bool), 4, loss.t_min, False,
                        torch.Generator().manual_seed(0))
    counts = torch.bincount(c.noisy.flatten(), minlength=4).float() / c.noisy.numel()
    assert torch.allclose(counts, torch.full((4,), 0.25), atol=0.015)


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_loss_is_the_formula(share: float) -> None:
    """The mean over answer positions of -log p(x_0), with the second pass reading the first's pinned logits."""
    network = tiny()
    tokens, answer = copy_batch(8, torch.Generator().manual_seed(2))
    loss, metrics = UniformDiffusionLoss(self_conditioning=share)(network, tokens, answer, MASK,
                                                                   torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(3)
    c = uniform_corrupt(tokens, answer, VOCAB, 1e-3, True, generator)
    previous = None
    if share:
        previous = pin_givens(network(c.noisy, fill=answer), tokens, answer)
    logits = network(c.noisy, previous, fill=answer)
    log_p = logits - logits.logsumexp(-1, keepdim=True)
    nll = -log_p.gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.allclose(loss, nll[answer].mean(), atol=1e-6)
    assert float(metrics["self_conditioned"]) == share


def test_self_conditioning_two_passes() -> None:
    """The chosen rows run first without gradient; the second pass reads their logits, givens pinned, and zeros
    (the signal of none) for the others; gradients flow through the second pass only."""
    network = tiny()
    calls: list[tuple[bool, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []

    def spy(tokens: torch.Tensor, previous: torch.Tensor | None = None, fill: torch.Tensor | None = None,
            conditioned: torch.Tensor | None = None) -> torch.Tensor:
        calls.append((torch.is_grad_enabled(), tokens, previous, conditioned))
        return network(tokens, previous, fill=fill, conditioned=conditioned)

    spy.config = network.config  # type: ignore[attr-defined]  # what the loss reads of the network
    tokens, answer = copy_batch(16, torch.Generator().manual_seed(4))
    loss, _ = UniformDiffusionLoss(self_conditioning=0.5)(spy, tokens, answer, MASK, torch.Generator().manual_seed(5))
    (grad_first, first_tokens, first_prev, _), (grad_second, second_tokens, previous, rows) = calls
    assert rows is not None and previous is not None and first_prev is None
    assert not grad_first and grad_second and 0 < int(rows.sum()) < 16
    assert torch.equal(first_tokens, second_tokens[rows])
    assert bool((previous[~rows] == 0).all())
    given = previous[rows][~answer[rows]].softmax(-1).amax(-1)
    assert bool((given == 1.0).all())  # the givens reach the second pass certain of themselves
    loss.backward()
    assert network.condition[1].weight.grad is not None
    # a row outside `conditioned` is the row without any signal
    logits = torch.randn(2, 6, VOCAB)
    off = network(tokens[:2], logits, fill=answer[:2], conditioned=torch.tensor([False, True]))
    assert torch.equal(off[0], network(tokens[:1], None, fill=answer[:1])[0])
    assert not torch.equal(off[1], network(tokens[1:2], None, fill=answer[1:2])[0])


def test_in_place_acceptance_ranks_only_positions_to_fill() -> None:
    """Top-k keeps k positions to fill (givens do not take its places); EB's bound sums over them alone."""
    logits = torch.tensor([[[9.0, 0, 0, 0], [2.0, 0, 0, 0], [1.0, 0, 0, 0], [0.5, 0, 0, 0]]])
    probs = logits.softmax(-1)
    drawn = torch.zeros(1, 4, dtype=torch.long)
    eligible = torch.tensor([[False, True, True, True]])
    draw = Draw(logits, probs, drawn, drawn, 0, 8, eligible)
    assert acceptance(TopKSampler(k=1))(draw).tolist() == [[False, True, False, False]]
    entropy = draw.entropy[0, 1:]
    gamma = float(entropy[0] + entropy[1] - entropy[1]) + 1e-6  # the first two pass, the third does not
    assert acceptance(EBSampler(gamma=gamma, ordering="entropy"))(draw).tolist() == [[False, True, True, False]]
    assert torch.allclose(draw.mean_entropy, entropy.mean())


def test_trained_tiny_network_decodes_through_the_revisable_sampler() -> None:
    """A hundred steps on the copy task, then sampler=diffusion_gemma fills it in place: givens kept, NFE counted,
    reveal steps only where it filled, and the copy right."""
    network = tiny(seed=0)
    objective = UniformDiffusionLoss()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        tokens, answer = copy_batch(32, generator)
        loss, _ = objective(network, tokens, answer, MASK, generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    network.eval()
    tokens, answer = copy_batch(64, torch.Generator().manual_seed(9))
    canvas = torch.where(answer, MASK, tokens)
    for rule in (EBSampler(gamma=0.1, ordering="entropy"), ThresholdSampler(tau=0.9)):
        sampler = RevisableSampler(rule=rule, t_min=0.1, t_max=0.2)
        counter = ForwardCounter(network, 64)
        with torch.no_grad():
            sampled = sampler.sample(counter, canvas, MASK, torch.Generator().manual_seed(1))
        assert torch.equal(sampled.tokens[~answer], tokens[~answer])
        assert bool((sampled.reveal_step[~answer] == -1).all()) and bool((sampled.reveal_step[answer] >= 0).all())
        assert float((sampled.tokens == tokens).all(1).float().mean()) >= 0.9
        assert bool((counter.nfe >= 1).all()) and float(counter.nfe.float().mean()) < sampler.max_steps
        assert "encoder" not in counter.extra  # in place: no encoder runs


def test_masked_sampler_refused_and_masked_model_unchanged() -> None:
    """A uniform-noise model takes the revisable sampler only; the masked model is built and loads as before, its
    logits on a fixed input unchanged."""
    with pytest.raises(CapabilityError, match="sampler=diffusion_gemma"):
        check_trained_for("mdmkit.objectives.UniformDiffusionLoss", EBSampler())
    check_trained_for("mdmkit.objectives.UniformDiffusionLoss", RevisableSampler())
    with pytest.raises(ConfigError, match="self_conditioning"):
        UniformDiffusionLoss(self_conditioning=1.5)
    trained = TrainedModel(ROOT / "checkpoints" / "sudoku_mdm.pt")
    network = trained.network()
    assert type(network) is MaskedTransformer
    tokens = torch.arange(89)[None] % trained.task.vocab_size
    with torch.no_grad():
        logits = network(tokens)
    assert torch.allclose(logits[0, 0, :4], torch.tensor([-3.6969, 0.0250, 1.3566, 2.1152]), atol=1e-3)
    assert abs(float(logits.sum()) - (-944.6354)) < 0.05  # measured before the uniform objective existed
    extra = set(tiny().state_dict()) - set(MaskedTransformer(SelfConditionedConfig(VOCAB, 6, d_model=32, n_heads=2,
                                                                                    n_layers=2)).state_dict())
    assert extra and all(name.startswith(("fill_embed.", "condition.")) for name in extra)


"""P2 path planning against exact expectations: independent references, hand-made re-masking cases, NFE."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
from fakes import FixedConfidence as Fixed
from fakes import random_transformer

from mdmkit.core.config import build, option
from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.samplers import ForwardCounter, P2Sampler

V, MASK, L = 6, 5, 10
ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


# Fixed(conf): position i predicts token i % 5 with probability conf[i] whatever the input; records its inputs.
# real_network(seed, d_model=, n_layers=): a small random transformer whose head is scaled up so its confidences
# differ clearly between positions.
real_network = partial(random_transformer, V, L, head_scale=40.0)


def prompts(rows: int, seed: int = 1) -> torch.Tensor:
    """Rows with 3..L masked positions at random places, the rest given."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(0, 5, (rows, L), generator=g)
    for row in range(rows):
        out[row, torch.randperm(L, generator=g)[: 3 + row % (L - 2)]] = MASK
    return out


def kappa(name: str, t: float) -> float:
    return {"linear": t, "cosine": 1 - math.cos(math.pi * t / 2), "sqrt": math.sqrt(t)}[name]


def target_masked(free: int, step: int, steps: int, schedule: str) -> int:
    """Masked non-fixed positions after 1-based `step`."""
    return 0 if step == steps else math.floor(free * (1 - kappa(schedule, step / steps)) + 1e-9)


def best(net: torch.nn.Module, x: torch.Tensor) -> tuple[list[float], list[int]]:
    """The denoiser's argmax token (never the mask) and its log-probability at every position of one row."""
    logits = net(x[None])[0].double()
    logits[:, MASK] = float("-inf")
    logp, tokens = logits.log_softmax(-1).max(-1)
    return logp.tolist(), tokens.tolist()


def greedy_reference(net: torch.nn.Module, prompt: torch.Tensor, steps: int, schedule: str) -> torch.Tensor:
    """Greedy ancestral decoding: reveal the kappa-scheduled number of most confident masked positions."""
    x = prompt.clone()
    free = int((prompt == MASK).sum())
    for step in range(1, steps + 1):
        logp, tokens = best(net, x)
        masked = [j for j in range(L) if x[j] == MASK]
        reveal = sorted(masked, key=lambda j: -logp[j])[: len(masked) - target_masked(free, step, steps, schedule)]
        for j in reveal:
            x[j] = tokens[j]
    return x


def rdm_reference(net: torch.nn.Module, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, bool]:
    """RDM: keep the top-kappa non-fixed positions by one score, masked or not; the rest become masks.

    Kept revealed positions keep their token, kept masked ones take the argmax. Also says whether any
    revealed position was ever masked again.
    """
    x = prompt.clone()
    free = [j for j in range(L) if prompt[j] == MASK]
    remasked = False
    for step in range(1, steps + 1):
        logp, tokens = best(net, x)
        keep = sorted(free, key=lambda j: -logp[j])[: len(free) - target_masked(len(free), step, steps, "linear")]
        for j in free:
            if j not in keep:
                remasked |= bool(x[j] != MASK)
                x[j] = MASK
            elif x[j] == MASK:
                x[j] = tokens[j]
    return x, remasked


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_eta_zero_is_greedy_ancestral_decoding(schedule: str) -> None:
    net, x = real_network(), prompts(6)
    out = P2Sampler(steps=5, eta=0.0, kappa=schedule).sample(ForwardCounter(net, 6), x, MASK)
    for row in range(6):
        assert torch.equal(out.tokens[row], greedy_reference(net, x[row], 5, schedule))


def test_eta_one_without_planner_is_rdm() -> None:
    net, x = real_network(), prompts(6)
    out = P2Sampler(steps=4, eta=1.0).sample(ForwardCounter(net, 6), x, MASK)
    any_remask = False
    for row in range(6):
        expected, remasked = rdm_reference(net, x[row], 4)
        assert torch.equal(out.tokens[row], expected)
        any_remask |= remasked
    assert any_remask  # the comparison covers re-masking, not only greedy reveals


# Three free positions, three steps: 2, 1, 0 stay masked. Position 0 is revealed first (confidence 0.8); at
# the second step it is re-masked iff eta * log 0.8 < log 0.55, i.e. eta > log 0.55 / log 0.8 = 2.679.
CONF = [0.8, 0.6, 0.55]


@pytest.mark.parametrize(("eta", "remasked"), [(0.0, False), (1.0, False), (2.6, False), (2.75, True), (10.0, True)])
def test_remasking_happens_exactly_when_eta_crosses_the_threshold(eta: float, remasked: bool) -> None:
    net = Fixed(CONF)
    out = P2Sampler(steps=3, eta=eta).sample(ForwardCounter(net, 1), torch.full((1, 3), MASK), MASK)
    assert out.tokens.tolist() == [[0, 1, 2]]
    assert [s.tolist() for s in net.seen] == (
        [[[MASK] * 3], [[0, MASK, MASK]], [[MASK, 1, 2]]] if remasked
        else [[[MASK] * 3], [[0, MASK, MASK]], [[0, 1, MASK]]]
    )
    assert out.reveal_step.tolist() == ([[2, 1, 1]] if remasked else [[0, 1, 2]])
    assert out.partition(0) == ([[], [1, 2], [0]] if remasked else [[0], [1], [2]])


def test_a_planner_scores_revealed_positions_and_sees_the_given_tokens() -> None:
    """The planner doubts position 0 (p = 0.5 < 0.55), so it is re-masked at eta = 1; position 3 is given."""
    net, planner = Fixed(CONF + [0.9]), Fixed([0.5, 0.9, 0.9, 0.9])
    counter = ForwardCounter(net, 1)
    sampler = P2Sampler(steps=3, eta=1.0, planner_cost=0.25, planner=planner)
    out = sampler.sample(counter, torch.tensor([[MASK, MASK, MASK, 4]]), MASK)
    assert out.tokens.tolist() == [[0, 1, 2, 4]]
    assert [s.tolist() for s in net.seen] == [[[MASK, MASK, MASK, 4]], [[0, MASK, MASK, 4]], [[MASK, 1, 2, 4]]]
    # not at the first step (nothing revealed to judge); it reads x0 with the given token restored (3 -> 4)
    assert [s.tolist() for s in planner.seen] == [[[0, 1, 2, 4]]] * 2
    assert counter.extra["planner"].tolist() == [0.5]
    assert out.reveal_step.tolist() == [[2, 1, 1, -1]]


def test_revealed_tokens_are_kept_even_when_the_denoiser_now_proposes_another() -> None:
    net = Fixed([0.9, 0.5, 0.8, 0.6, 0.7], unmasked_token=3)  # at a revealed position it always says 3
    x = torch.tensor([[MASK] * 5])
    for eta in (0.0, 1.0, 5.0):
        out = P2Sampler(steps=4, eta=eta).sample(ForwardCounter(net, 1), x, MASK)
        assert out.tokens.tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("schedule", ["linear", "cosine", "sqrt"])
def test_masked_count_follows_the_schedule(schedule: str) -> None:
    net = Fixed([0.9, 0.5, 0.8, 0.6, 0.7, 0.55, 0.65, 0.75, 0.85, 0.95])
    x = torch.tensor([[MASK] * 10, [1, MASK, 2, MASK, MASK, 0, MASK, MASK, 3, MASK]])
    out = P2Sampler(steps=7, eta=3.0, kappa=schedule).sample(ForwardCounter(net, 2), x, MASK)
    masks = [(state == MASK).sum(1).tolist() for state in net.seen]
    assert masks == [[target_masked(n, step, 7, schedule) if step else n for n in (10, 6)] for step in range(7)]
    assert (out.tokens != MASK).all()


def test_nfe_is_steps_per_row_and_the_planner_is_charged_at_its_share() -> None:
    net, planner = real_network(0), real_network(1, d_model=16, n_layers=1)
    x = prompts(3)
    x[2] = 1  # nothing to fill: never forwarded
    share = planner.num_parameters() / net.num_parameters()
    counter = ForwardCounter(net, 3)
    out = P2Sampler(steps=6, eta=1.5, planner=planner).sample(counter, x, MASK)
    assert counter.nfe.tolist() == [6, 6, 0]
    assert out.steps.tolist() == [6, 6, 0]
    assert counter.extra["planner"].tolist() == pytest.approx([5 * share, 5 * share, 0.0])
    assert counter.cost.tolist() == pytest.approx([6 + 5 * share, 6 + 5 * share, 0.0])
    plain = ForwardCounter(net, 3)
    P2Sampler(steps=6).sample(plain, x, MASK)
    assert plain.nfe.tolist() == [6, 6, 0] and plain.extra == {}


def test_planner_share_defaults_to_one_without_parameter_counts() -> None:
    counter = ForwardCounter(Fixed(CONF), 1)  # a parameter-free denoiser
    P2Sampler(steps=3, planner=Fixed(CONF)).sample(counter, torch.full((1, 3), MASK), MASK)
    assert counter.extra["planner"].tolist() == [2.0]


def test_batched_equals_one_by_one_and_fixed_positions_never_change() -> None:
    net, planner = real_network(0), real_network(2, d_model=16, n_layers=1)
    x = prompts(6)
    sampler = P2Sampler(steps=5, eta=2.0, kappa="cosine", planner=planner)
    batched = sampler.sample(ForwardCounter(net, 6), x, MASK)
    for row in range(6):
        single = sampler.sample(ForwardCounter(net, 1), x[row : row + 1], MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
    given = x != MASK
    assert torch.equal(batched.tokens[given], x[given]) and (batched.reveal_step[given] == -1).all()
    assert (batched.tokens != MASK).all() and (batched.reveal_step[~given] >= 0).all()


@pytest.mark.parametrize("score", ["confidence", "random"])
def test_same_seed_same_sample_at_temperature_one(score: str) -> None:
    net, x = real_network(), prompts(6)
    sampler = P2Sampler(steps=5, eta=1.5, temperature=1.0, score=score)

    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = sampler.sample(ForwardCounter(net, 6), x, MASK, torch.Generator().manual_seed(seed))
        return out.tokens, out.reveal_step

    first, again, other = draw(0), draw(0), draw(1)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not (torch.equal(first[0], other[0]) and torch.equal(first[1], other[1]))
    given = x != MASK
    assert torch.equal(first[0][given], x[given]) and (first[0] != MASK).all()


def test_temperature_draws_follow_the_distribution() -> None:
    x = torch.zeros(4000, 3, dtype=torch.long)
    x[:, 0] = MASK  # one masked position: a single draw from its distribution (0.8 on token 0)
    out = P2Sampler(steps=1, temperature=1.0).sample(ForwardCounter(Fixed(CONF), 4000), x, MASK,
                                                     torch.Generator().manual_seed(0))
    assert abs(float((out.tokens[:, 0] == 0).float().mean()) - 0.8) < 0.03
    assert (out.tokens[:, 0] != MASK).all()


@pytest.mark.parametrize(
    "fields",
    [{"eta": -0.1}, {"steps": 0}, {"kappa": "quadratic"}, {"score": "entropy"}, {"temperature": -1.0},
     {"planner_cost": -0.5}, {"steps": 2.5}, {"planner": "p.pt", "score": "random"}],
)
def test_bad_config_is_a_config_error(fields: dict) -> None:
    with pytest.raises(ConfigError):
        P2Sampler(**fields)


def test_config_file_builds_the_defaults_and_rejects_misuse() -> None:
    assert build(option("sampler", "p2"), "sampler") == P2Sampler()
    with pytest.raises(ConfigError, match="score='confidence'"):
        P2Sampler(score="random", planner=Fixed(CONF))
    with pytest.raises(ValueError, match="stop condition"):
        P2Sampler().sample(ForwardCounter(Fixed(CONF), 1), torch.full((1, 3), MASK), MASK, stop=StopCondition.of([1]))


def test_a_planner_checkpoint_is_resolved_by_evaluation_not_by_the_sampler(tmp_path: Path) -> None:
    config = {"_target_": "mdmkit.samplers.P2Sampler", "steps": 2, "planner": str(tmp_path / "missing.pt")}
    with pytest.raises(CheckpointError, match="not found"):
        build_sampler(config)  # checked before any model is loaded
    with pytest.raises(ConfigError, match="loaded network"):
        P2Sampler(planner="a/path.pt")  # a sampler never opens files


def test_a_planner_of_another_task_is_one_line() -> None:
    base = TrainedModel(ROOT / "checkpoints/sudoku_mdm.pt").network()
    config = {"_target_": "mdmkit.samplers.P2Sampler", "steps": 2, "planner": str(ROOT / "checkpoints/maze_mdm.pt")}
    with pytest.raises(CheckpointError, match=r"maze_mdm.pt: a model of another task \(\d+ tokens, 50 positions\) "
                                              r"than the one evaluated \(\d+ tokens, 89 positions\)"):
        build_sampler(config, base)
    same = {**config, "planner": str(ROOT / "checkpoints/sudoku_mdm.pt")}
    assert build_sampler(same, base).planner is not None

"""Self-speculative MDM: exactness of speculative sampling (enumerated, statistical), causality of the hybrid
network, the residual and first-position rules, the eq. 9 loss, NFE accounting, configs and a training run."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_config
from fakes import HybridTable as Table
from fakes import random_transformer

from mdmkit.core.config import build, option
from mdmkit.core.errors import ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.models.speculative import SpeculativeConfig, SpeculativeTransformer, Trunk
from mdmkit.objectives.masked_diffusion import MaskedDiffusionLoss
from mdmkit.objectives.speculative import SpeculativeLoss, random_order
from mdmkit.samplers import ForwardCounter
from mdmkit.samplers.rules.speculative import SpeculativeSampler, WindowSampler, accept, residual, window_size
from mdmkit.training.preflight import plan_training
from mdmkit.training.train import run_training

ROOT = Path(__file__).resolve().parents[1]
MASK = 3  # vocabulary: tokens 0, 1, 2 and the mask
PERMUTATIONS = list(itertools.permutations(range(3)))
SEQUENCES = list(itertools.product(range(3), repeat=3))


pytestmark = pytest.mark.usefixtures("one_thread")


def hybrid(positions: str = "rotary", length: int = 3, seed: int = 1,
           n_causal: int = 1) -> SpeculativeTransformer:
    """A random hybrid whose causal target differs clearly from its draft (TV 0.5 on 3 positions, default)."""
    torch.manual_seed(seed)
    config = SpeculativeConfig(vocab_size=4, max_len=length, n_noncausal=1, n_causal=n_causal, d_model=16,
                               n_heads=2, positions=positions)
    net = config.build().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.5)
        net.out.weight.mul_(3.0)
    return net


def probs(logits: torch.Tensor) -> torch.Tensor:
    """Temperature-1 distribution over the real tokens (the mask ruled out), in float64."""
    return logits.double().index_fill(-1, torch.tensor([MASK]), float("-inf")).softmax(-1)


@torch.no_grad()
def factors(net: SpeculativeTransformer) -> tuple[torch.Tensor, dict[tuple, list[torch.Tensor]]]:
    """From the all-masked state: the draft [3, 3] and, per (σ, x), the target of every position [3, 3]."""
    trunk = net.noncausal(torch.full((1, 3), MASK))
    tokens = torch.tensor([x for _ in PERMUTATIONS for x in SEQUENCES])
    orders = torch.tensor([s for s in PERMUTATIONS for _ in SEQUENCES])
    n = len(tokens)
    target = net.causal(Trunk(trunk.hidden.expand(n, -1, -1), trunk.logits.expand(n, -1, -1)), tokens, orders,
                        torch.zeros(n, dtype=torch.long))
    target = probs(target)[..., :MASK]
    table = {(s, x): target[i] for i, (s, x) in enumerate(itertools.product(PERMUTATIONS, SEQUENCES))}
    return probs(trunk.logits)[0, :, :MASK], table


def law_all_loops(net: SpeculativeTransformer) -> dict[tuple, float]:
    """The law of one trunk pass with unlimited inner loops and a window of 3: the causal AR joint, averaged
    over the uniform σ (its first factor is the draft: the first-position rule)."""
    draft, target = factors(net)
    law: dict[tuple, float] = Counter()
    for s, x in itertools.product(PERMUTATIONS, SEQUENCES):
        t = target[s, x]
        law[x] += float(draft[s[0], x[s[0]]] * t[s[1], x[s[1]]] * t[s[2], x[s[2]]]) / 6
    return law


def law_one_loop(net: SpeculativeTransformer, resample_from_target: bool = False) -> dict[tuple, float]:
    """The law of one trunk pass with a single inner loop (window 3), from Lemma C.1: at σ(1) the draft is
    accepted as b with probability min(q_d(b), q_c(b)), then σ(2) follows the target; or it is rejected and b
    drawn, with probability max(0, q_c(b) - q_d(b)), leaving σ(2) masked. `resample_from_target` is the
    classic bug of resampling from the target instead of the residual (a power check)."""
    draft, target = factors(net)
    law: dict[tuple, float] = Counter()
    for s, x in itertools.product(PERMUTATIONS, SEQUENCES):
        t, a, b = target[s, x], x[s[0]], x[s[1]]
        kept = min(float(draft[s[1], b]), float(t[s[1], b]))
        law[x] += float(draft[s[0], a]) * kept * float(t[s[2], x[s[2]]]) / 6
        if x[s[2]] == 0:  # the rejected outcome does not depend on x at σ(2): count it once
            partial = tuple(MASK if i == s[2] else x[i] for i in range(3))
            rejected = 1.0 - float(torch.minimum(draft[s[1]], t[s[1]]).sum())
            excess = max(0.0, float(t[s[1], b] - draft[s[1], b]))
            fresh = float(t[s[1], b]) * rejected if resample_from_target else excess
            law[partial] += float(draft[s[0], a]) * fresh / 6
    return law


def tv(p: dict[tuple, float], q: dict[tuple, float]) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def tolerance(law: dict[tuple, float], n: int) -> float:
    """A bound the empirical TV distance to `law` exceeds with probability < e^-24 when the samples follow
    `law`: E[TV] <= 1/2 sum sqrt(p (1 - p) / n) (Jensen), plus McDiarmid's deviation sqrt(24 / (2 n))."""
    return 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in law.values()) + math.sqrt(12 / n)


def empirical(tokens: torch.Tensor) -> dict[tuple, float]:
    counts = Counter(map(tuple, tokens.tolist()))
    return {k: v / len(tokens) for k, v in counts.items()}


N = 30_000


def test_unlimited_inner_loops_sample_exactly_the_causal_joint() -> None:
    net = hybrid()
    law = law_all_loops(net)
    draft, _ = factors(net)
    factorised = {x: float(draft[0, x[0]] * draft[1, x[1]] * draft[2, x[2]]) for x in SEQUENCES}
    counter = ForwardCounter(net, N)
    sampler = SpeculativeSampler(window_param=1.0, inner_loops=3)  # one window holds all three positions
    out = sampler.sample(counter, torch.full((N, 3), MASK), MASK, torch.Generator().manual_seed(0))
    assert (out.steps == 1).all() and (counter.nfe == 1).all()  # one trunk pass reveals everything
    tol = tolerance(law, N)
    assert tv(empirical(out.tokens), law) < tol
    assert tv(factorised, law) > 5 * tol  # the test tells the target from an MDM's factorised draft
    extra = counter.extra["causal"] / net.causal_share  # extra causal passes per row: rejections before σ(2)
    assert set(extra.round().long().tolist()) == {0, 1} and 0.1 < float(extra.mean()) < 0.9


def test_one_inner_loop_follows_lemma_c1() -> None:
    net = hybrid()
    law = law_one_loop(net)
    counter = ForwardCounter(net, N)
    out = SpeculativeSampler(window_param=1.0).sample(counter, torch.full((N, 3), MASK), MASK,
                                                      torch.Generator().manual_seed(1))
    assert counter.extra == {}  # one causal pass per trunk pass
    first_pass = torch.where(out.reveal_step == 0, out.tokens, MASK)
    tol = tolerance(law, N)
    assert tv(empirical(first_pass), law) < tol
    assert tv(law_one_loop(net, resample_from_target=True), law) > 3 * tol
    rejected = (first_pass == MASK).any(1)
    assert torch.equal(counter.nfe, 1 + rejected.long())  # a second pass fills the position left masked
    assert 0.05 < float(rejected.float().mean()) < 0.95  # both branches of the lemma are exercised


def test_accept_and_residual_follow_lemma_c1_on_a_hand_made_pair() -> None:
    """q_d = (.5, .3, .2), q_c = (.2, .3, .5): accept-and-x has probability min = (.2, .3, .2), reject-and-x
    max(0, q_c - q_d) = (0, 0, .3); the residual is all on token 2."""
    draft = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    target = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert residual(draft, target).tolist() == [0.0, 0.0, 1.0]
    assert torch.equal(residual(draft, draft), draft)  # equal distributions: no rejection, the target itself
    g, n = torch.Generator().manual_seed(0), 200_000
    drafted = torch.multinomial(draft, n, replacement=True, generator=g)
    kept = accept(draft[drafted], target[drafted], g)
    fresh = torch.multinomial(residual(draft, target), n, replacement=True, generator=g)
    cells = Counter(zip(kept.tolist(), torch.where(kept, drafted, fresh).tolist()))
    law = {(True, 0): 0.2, (True, 1): 0.3, (True, 2): 0.2, (False, 2): 0.3}
    assert tv({k: v / n for k, v in cells.items()}, law) < tolerance(law, n)


# Table(draft, target): a hand-made hybrid, each position's draft a fixed row of `draft`, the target `target`
# after σ(n_known); records the inputs of its causal calls.
# Drafts say 0 everywhere, most confidently at position 1, then 2, then 0 (σ = 1, 2, 0); the target says 2.
DRAFT = [[0.5, 0.3, 0.2, 0.0], [0.7, 0.2, 0.1, 0.0], [0.6, 0.3, 0.1, 0.0]]
TARGET = [0.1, 0.2, 0.7, 0.0]


def test_first_position_keeps_its_draft_and_a_rejection_takes_the_residual() -> None:
    greedy = {"window_param": 1.0, "ordering": "confidence", "temperature": 0.0}
    net = Table(DRAFT, TARGET)
    counter = ForwardCounter(net, 1)
    out = SpeculativeSampler(**greedy).sample(counter, torch.full((1, 3), MASK), MASK)
    # pass 1: σ(0) = position 1 keeps its draft 0 (no earlier token to verify against); position 2's draft 0
    # is rejected and replaced by the residual's token 2, which ends the loop; pass 2 drafts position 0 alone
    assert out.tokens.tolist() == [[0, 0, 2]] and out.reveal_step.tolist() == [[1, 0, 0]]
    assert counter.nfe.tolist() == [2] and counter.extra == {}
    net = Table(DRAFT, TARGET)
    counter = ForwardCounter(net, 1)
    out = SpeculativeSampler(**greedy, inner_loops=2).sample(counter, torch.full((1, 3), MASK), MASK)
    assert out.tokens.tolist() == [[2, 0, 2]] and out.steps.tolist() == [1]
    assert net.seen[1] == ([[0, 0, 2]], [[1, 2, 0]])  # loop 2 sees the resampled token and the draft after it
    assert counter.nfe.tolist() == [1] and counter.extra["causal"].tolist() == [0.25]
    net = Table(DRAFT, TARGET)
    out = WindowSampler(**greedy).sample(ForwardCounter(net, 1), torch.full((1, 3), MASK), MASK)
    assert out.tokens.tolist() == [[0, 0, 0]] and net.seen == []  # the same window, unverified


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_causal_outputs_depend_only_on_earlier_tokens_in_the_order(positions: str) -> None:
    net = hybrid(positions, length=8, n_causal=2)
    g = torch.Generator().manual_seed(0)
    state = torch.randint(0, 3, (4, 8), generator=g)
    masked = torch.rand(4, 8, generator=g) < 0.6
    masked[:, 0] = True
    order, n_known = random_order(masked, g), (~masked).sum(1)
    trunk = net.noncausal(state.masked_fill(masked, MASK))
    clean = torch.randint(0, 3, (4, 8), generator=g)
    tokens = torch.where(masked, clean, state)
    before = net.causal(trunk, tokens, order, n_known)
    rows = torch.arange(4)
    first = order[rows, n_known]
    assert torch.equal(before[rows, first], trunk.logits[rows, first])  # the first masked position: its draft
    assert torch.equal(before[~masked], trunk.logits[~masked])
    changed_next = 0
    for row in range(4):
        for k in range(int(n_known[row]), 7):
            edited = tokens.clone()
            edited[row, order[row, k]] = (edited[row, order[row, k]] + 1) % 3
            after = net.causal(trunk, edited, order, n_known)
            upto = order[row, : k + 1]
            assert torch.allclose(after[row, upto], before[row, upto], atol=1e-6)
            changed_next += not torch.allclose(after[row, order[row, k + 1]], before[row, order[row, k + 1]])
    assert changed_next > 0  # later outputs do read earlier tokens


def test_the_trunk_is_an_mdm_that_ignores_the_order_and_loads_an_mdm_checkpoint() -> None:
    mdm = random_transformer(4, 8, None, d_model=16)
    net = SpeculativeConfig(vocab_size=4, max_len=8, n_noncausal=2, d_model=16, n_heads=2).build().eval()
    head = {k: v.clone() for k, v in net.state_dict().items() if not k.startswith("trunk.")}
    net.load_state_dict(mdm.state_dict())  # init_from=<an MDM>: the trunk only
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in head.items())
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (3, 8), generator=g)
    assert torch.allclose(net(x), mdm(x), atol=1e-6)
    trunk = net(x, return_trunk=True)
    assert torch.equal(trunk.logits, net(x))
    masked = x == MASK
    for seed in range(3):  # any order, any tokens on the causal tracks: the trunk output is the same
        order = random_order(masked, torch.Generator().manual_seed(seed))
        target = net.causal(trunk, torch.randint(0, 3, (3, 8), generator=g), order, (~masked).sum(1))
        assert torch.equal(net(x), trunk.logits)
        assert torch.allclose(target, trunk.logits)  # an untrained head adds nothing: target == draft


def test_loss_is_both_cross_entropies_each_over_the_masked_count() -> None:
    torch.manual_seed(0)
    net = SpeculativeConfig(vocab_size=4, max_len=6, n_noncausal=1, d_model=16, n_heads=2).build()
    tokens = torch.randint(0, 3, (5, 6))
    answer = torch.ones(5, 6, dtype=torch.bool)
    answer[:, :2] = False
    loss, metrics = SpeculativeLoss()(net, tokens, answer, MASK, torch.Generator().manual_seed(3))
    assert set(metrics) == {"noncausal_ce", "causal_ce", "masked_acc", "causal_acc"}
    assert float(metrics["causal_ce"]) == float(metrics["noncausal_ce"])  # the output residual at init
    with torch.no_grad():
        net.out.weight.normal_(0.0, 1.0)
    loss, metrics = SpeculativeLoss()(net, tokens, answer, MASK, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # replay the draws: masking, then σ
    corruption = MaskedDiffusionLoss().corrupt(tokens, answer, MASK, g)
    masked = corruption.masked
    order = random_order(masked, g)
    with torch.no_grad():
        trunk = net.noncausal(corruption.noisy)
        target = net.causal(trunk, tokens, order, (~masked).sum(1))
    terms = {"noncausal_ce": [], "causal_ce": []}
    for row in range(5):
        where = masked[row].nonzero().flatten()
        if len(where):
            for name, logits in (("noncausal_ce", trunk.logits), ("causal_ce", target)):
                ce = torch.nn.functional.cross_entropy(logits[row, where], tokens[row, where])
                terms[name].append(ce)
    expected = {name: torch.stack(values).mean() for name, values in terms.items()}
    assert float(metrics["causal_ce"]) != pytest.approx(float(metrics["noncausal_ce"]))
    for name in terms:
        assert float(metrics[name]) == pytest.approx(float(expected[name]), rel=1e-5)
    total = expected["noncausal_ce"] + expected["causal_ce"]
    assert float(loss.detach()) == pytest.approx(float(total), rel=1e-5)


def test_a_frozen_trunk_gets_no_gradient() -> None:
    net = SpeculativeConfig(vocab_size=4, max_len=6, n_noncausal=1, d_model=16, n_heads=2,
                            freeze_noncausal=True).build()
    loss, _ = SpeculativeLoss()(net, torch.randint(0, 3, (4, 6)), torch.ones(4, 6, dtype=torch.bool), MASK,
                                torch.Generator().manual_seed(0))
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in net.trunk.parameters())
    assert net.out.weight.grad is not None and float(net.out.weight.grad.abs().sum()) > 0


def test_the_causal_target_learns_what_the_factorised_draft_cannot() -> None:
    """Two positions always equal, uniform over 3 tokens. Fully masked, the best draft pays log 3 per position
    and reveals unequal pairs 2/3 of the time; the causal target copies the first token: (log 3) / 2."""
    torch.manual_seed(0)
    net = SpeculativeConfig(vocab_size=4, max_len=2, n_noncausal=1, d_model=16, n_heads=2).build()
    optimizer, g = torch.optim.AdamW(net.parameters(), lr=3e-3), torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = torch.randint(0, 3, (64, 1), generator=g).repeat(1, 2)
        loss, _ = SpeculativeLoss()(net, tokens, torch.ones(64, 2, dtype=torch.bool), MASK, g)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    net.eval()
    tokens = torch.randint(0, 3, (512, 1), generator=g).repeat(1, 2)
    with torch.no_grad():
        trunk = net.noncausal(torch.full_like(tokens, MASK))
        target = net.causal(trunk, tokens, random_order(tokens >= 0, g), torch.zeros(512, dtype=torch.long))
    ce = {name: float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens))
          for name, logits in (("draft", trunk.logits), ("target", target))}
    assert ce["draft"] > 1.05 and ce["target"] < 0.65  # log 3 = 1.10, (log 3) / 2 = 0.55
    blank = torch.full((2000, 2), MASK)
    cases = ((SpeculativeSampler(window_param=1.0), (0.95, 1.0)),
             (WindowSampler(window_param=1.0), (0.25, 0.45)))
    for sampler, (low, high) in cases:  # equal pairs: ~all when verified, ~1/3 from the factorised draft
        out = sampler.sample(ForwardCounter(net, 2000), blank, MASK, torch.Generator().manual_seed(0))
        assert (out.steps == 1).all()  # both positions in one pass
        assert low <= float((out.tokens[:, 0] == out.tokens[:, 1]).float().mean()) <= high


def prompts(rows: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(0, 3, (rows, length), generator=g)
    for row in range(rows):
        out[row, torch.randperm(length, generator=g)[: 2 + row % (length - 1)]] = MASK
    return out


@pytest.mark.parametrize(("window", "param"), [("linear", 1.0), ("cosine", 0.5)])
def test_batched_equals_one_by_one(window: str, param: float) -> None:
    net, x = hybrid(length=8), prompts(6, 8)
    sampler = SpeculativeSampler(window=window, window_param=param, inner_loops=2, ordering="confidence",
                                 temperature=0.0)
    counter = ForwardCounter(net, 6)
    batched = sampler.sample(counter, x, MASK)
    assert float(counter.extra["causal"].sum()) > 0  # rejections happened: the inner loops ran
    for row in range(6):
        single_counter = ForwardCounter(net, 1)
        single = sampler.sample(single_counter, x[row : row + 1], MASK)
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert single_counter.nfe.tolist() == [int(counter.nfe[row])]
        assert single_counter.cost.tolist() == pytest.approx([float(counter.cost[row])])
    given = x != MASK
    assert torch.equal(batched.tokens[given], x[given]) and (batched.tokens != MASK).all()
    assert torch.equal(counter.nfe, batched.steps)  # one NFE per trunk pass


def test_windows_follow_appendix_d() -> None:
    # cosine, time step 0.25: from t = 1 to 0.75 a cosine MDM reveals 1 - cos(pi / 8) = 7.6% (-> 8 of 100); at
    # half masked (t = 1/3) it moves to t = 1/12, revealing 0.5 - cos(11 pi / 24) = 36.9% (-> 37)
    hundred, ten = torch.tensor([100, 100, 100]), torch.tensor([10, 10, 10])
    assert window_size("cosine", 0.25, torch.tensor([100, 50, 3]), hundred).tolist() == [8, 37, 3]
    assert window_size("linear", 0.5, torch.tensor([10, 8, 1]), ten).tolist() == [1, 2, 1]
    for steps, total in itertools.product([2, 5, 12], [3, 45, 81]):  # no rejections: at most `steps` passes
        masked, passes = total, 0
        while masked:
            masked -= int(window_size("cosine", 1 / steps, torch.tensor([masked]), torch.tensor([total])))
            passes += 1
        assert passes <= steps


def test_model_guided_orders_reveal_the_most_confident_position_first() -> None:
    net = Table(DRAFT, TARGET)
    out = WindowSampler(window="linear", window_param=0.0, ordering="confidence", temperature=0.0).sample(
        ForwardCounter(net, 1), torch.full((1, 3), MASK), MASK)
    assert out.partition(0) == [[1], [2], [0]]


@pytest.mark.parametrize("stop_early", [True, False])
def test_a_stop_sequence_ends_a_row_once_it_is_settled(stop_early: bool) -> None:
    """Position 0 is given; the first pass reveals position 1 (the most confident) as 0, the stop token."""
    counter = ForwardCounter(Table(DRAFT, TARGET), 1)
    sampler = SpeculativeSampler(window="linear", window_param=0.0, ordering="confidence", temperature=0.0,
                                 stop_early=stop_early)
    out = sampler.sample(counter, torch.tensor([[1, MASK, MASK]]), MASK, stop=StopCondition.of([0]))
    assert out.tokens.tolist() == ([[1, 0, MASK]] if stop_early else [[1, 0, 0]])
    assert counter.nfe_at_stop.tolist() == [1] and counter.nfe.tolist() == [1 if stop_early else 2]


@pytest.mark.parametrize(
    ("cls", "fields"),
    [(SpeculativeSampler, {"window": "square"}), (SpeculativeSampler, {"window_param": 0.0}),
     (SpeculativeSampler, {"window_param": 1.5}),
     (SpeculativeSampler, {"window": "linear", "window_param": -1.0}),
     (SpeculativeSampler, {"inner_loops": 0}), (SpeculativeSampler, {"inner_loops": 1.5}),
     (SpeculativeSampler, {"ordering": "left_to_right"}), (WindowSampler, {"temperature": -1.0}),
     (WindowSampler, {"top_p": 0.0}), (SpeculativeLoss, {"t_min": 0.0}),
     (SpeculativeConfig, {"n_causal": 0}), (SpeculativeConfig, {"n_noncausal": 0}),
     (SpeculativeConfig, {"d_model": 30, "n_heads": 4}),
     (SpeculativeConfig, {"positions": "rotary", "d_model": 24, "n_heads": 4}),
     (SpeculativeConfig, {"freeze_noncausal": "yes"})],
)
def test_bad_config_is_a_config_error(cls: type, fields: dict) -> None:
    shape = {"vocab_size": 4, "max_len": 8} if cls is SpeculativeConfig else {}
    with pytest.raises(ConfigError):
        cls(**shape, **fields)


def test_config_files_build_and_misuse_is_refused() -> None:
    def load(name: str, **kwargs: int) -> object:
        return build(option(*name.split("/")), name, **kwargs)

    assert load("sampler/speculative") == SpeculativeSampler(window_param=0.083)
    assert load("sampler/window") == WindowSampler(window_param=0.083)
    assert load("objective/speculative") == SpeculativeLoss()
    for name in ("tiny", "cpu", "head", "paper"):
        spec = load(f"model/speculative_{name}", vocab_size=12, max_len=81)
        assert isinstance(spec.build(), SpeculativeTransformer)
    mdm = random_transformer(4, 3, None, n_layers=1, d_model=16)
    with pytest.raises(ValueError, match="causal blocks"):
        SpeculativeSampler().sample(ForwardCounter(mdm, 1), torch.full((1, 3), MASK), MASK)
    WindowSampler().sample(ForwardCounter(mdm, 1), torch.full((1, 3), MASK), MASK)  # any MDM
    with pytest.raises(ValueError, match="unpadded"):
        SpeculativeSampler().sample(ForwardCounter(hybrid(), 1), torch.full((1, 3), MASK), MASK,
                                    attention_mask=torch.tensor([[True, True, False]]))


def _train(path: Path, *overrides: str) -> dict:
    tiny = [o for o in TINY if not o.startswith("model=")]
    config = compose_config("train", [*tiny, f"results_file={path}/results.jsonl", *overrides])
    return run_training(plan_training(config), path)


def test_training_a_hybrid_and_a_causal_head_on_a_frozen_mdm(tmp_path: Path) -> None:
    summary = _train(tmp_path / "hybrid", "experiment=sudoku_speculative", "model=speculative_tiny")
    assert summary["global_step"] == 4 and summary["n"] == 40 and 0 < summary["nfe_mean"] <= 45
    assert isinstance(TrainedModel(tmp_path / "hybrid/model.pt").network(), SpeculativeTransformer)
    _train(tmp_path / "mdm", "model=tiny", "trainer.max_steps=2", "evaluate_after_training=false")
    mdm = TrainedModel(tmp_path / "mdm/model.pt").network()
    _train(tmp_path / "head", "experiment=sudoku_speculative_head", "model=speculative_tiny",
           "model.n_noncausal=2", "model.freeze_noncausal=true", f"init_from={tmp_path}/mdm/model.pt",
           "evaluate_after_training=false")
    net = TrainedModel(tmp_path / "head/model.pt").network()
    assert all(torch.equal(v, net.trunk.state_dict()[k]) for k, v in mdm.state_dict().items())
    assert float(net.out.weight.detach().abs().sum()) > 0  # the causal block did train

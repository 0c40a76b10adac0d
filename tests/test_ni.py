"""NI sampling: merge labels by hand and against the oracle, an oracle indicator at the floor, features, the
online sampler against its base, batching, bad configs, and the offline side (trajectories, training) on tiny
data."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_config
from fakes import DEPS, TARGET, Dependent, random_transformer
from omegaconf import open_dict

from mdmkit.core.config import build, to_container
from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.evaluation.evaluate import run_evaluation
from mdmkit.evaluation.plan import plan_evaluation
from mdmkit.evaluation.resolve import build_sampler
from mdmkit.evaluation.sweep import expand
from mdmkit.io.checkpoint import save_slim
from mdmkit.io.indicator import load_indicator, save_indicator
from mdmkit.models.denoiser import without_mask
from mdmkit.models.indicator import (
    Features,
    IndicatorConfig,
    IndicatorScorer,
    features,
)
from mdmkit.objectives.indicator import draw_rollback, merge_labels, rollback_state
from mdmkit.samplers import (
    EBSampler,
    ForwardCounter,
    MaskedSampler,
    Sampled,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)
from mdmkit.samplers.rules.ni import NISampler
from mdmkit.samplers.rules.oracle import oracle_floor, oracle_groups
from mdmkit.samplers.rules.p2 import P2Sampler
from mdmkit.training.indicator.trajectories import TrajectoryConfig, build_trajectories, load_trajectories
from mdmkit.training.module import MDMModule

V, M, L = 9, 8, 14  # vocabulary (the last token is the mask), mask id, sequence length
INF = math.inf
NI = "mdmkit.samplers.NISampler"


pytestmark = pytest.mark.usefixtures("one_thread")


def network(seed: int = 1) -> torch.nn.Module:
    return random_transformer(V, L, seed)


def prompts(rows: int = 5, given: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    x = torch.full((rows, L), M)
    x[:, :given] = torch.randint(0, M, (rows, given), generator=generator)
    return x


def run(sampler, net, x: torch.Tensor, seed: int | None = None) -> tuple[Sampled, ForwardCounter]:
    counter = ForwardCounter(net, len(x))
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return sampler.sample(counter, x, M, generator), counter


def scorer(net: torch.nn.Module, scale: float = 1.0, seed: int = 0) -> IndicatorScorer:
    torch.manual_seed(seed)
    indicator = IndicatorConfig(top_tokens=2, top_probs=3, width=16).build(32, V).eval()
    with torch.no_grad():
        indicator.head.weight.mul_(scale)
    return IndicatorScorer(indicator, net.embed)


# -- labels: the merge criterion with its order constraint ------------------------------------------------

# TARGET, DEPS: 1, 3, 6 are always right; 5 needs 3 revealed, 2 needs 5, 4 needs 2
PARTITION = [[3], [1, 5], [2], [6], [4]]


def dependent_argmax(state: torch.Tensor) -> torch.Tensor:
    """The argmax of a network that predicts TARGET[i] once all of DEPS[i] is revealed, else a wrong token."""
    return Dependent(TARGET, DEPS, vocab=V)(state).argmax(-1)


def hand_made() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.tensor([TARGET])
    reveal = torch.full_like(tokens, -1)
    for step, positions in enumerate(PARTITION):
        reveal[0, positions] = step
    return tokens, reveal, torch.tensor([len(PARTITION)])


@pytest.mark.parametrize(
    "done, positive",
    [
        (0, [3]),  # step 1 holds 5 (wrong: 3 masked), so nothing merges; 1 and 6 are right but not labelled
        (1, [1, 5]),  # step 2 ({2}) is wrong; 6 (step 3) is right, but the order constraint keeps it back
        (2, [2, 6]),  # step 3 ({6}) right -> merged; step 4 ({4}) needs 2 -> stop
        (3, [4, 6]),
        (4, [4]),
    ],
)
def test_hand_made_labels_follow_the_merge_and_its_order_constraint(done: int, positive: list[int]) -> None:
    tokens, reveal, steps = hand_made()
    state = rollback_state(tokens, reveal, torch.tensor([done]), M)
    assert state[0].tolist() == [t if step < done else M for t, step in zip(TARGET, reveal[0].tolist())]
    labels = merge_labels(dependent_argmax(state), tokens, reveal, torch.tensor([done]), steps)
    assert torch.nonzero(labels[0]).flatten().tolist() == positive
    assert not (labels & (reveal < done)).any()  # only still-masked positions are ever labelled


def walk_labels(net, prompt: torch.Tensor, reference: Sampled) -> list[list[int]]:
    """Merge from step 0 by the labels alone: the groups of reference steps revealed per pass."""
    groups, done = [], 0
    while done < int(reference.steps[0]):
        state = rollback_state(reference.tokens, reference.reveal_step, torch.tensor([done]), M)
        assert torch.equal(state[prompt != M], prompt[prompt != M])
        predicted = without_mask(net(state), M).argmax(-1)
        labels = merge_labels(
            predicted, reference.tokens, reference.reveal_step, torch.tensor([done]), reference.steps
        )
        merged = sorted(set(reference.reveal_step[labels].tolist()))
        assert merged == list(range(done, merged[-1] + 1))  # consecutive steps, starting at the current one
        groups.append(merged)
        done = merged[-1] + 1
    return groups


@pytest.mark.parametrize(
    "sampler", [TopKSampler(k=1), TopKSampler(k=2, ordering="margin"), ThresholdSampler(tau=0.3)]
)
def test_labels_walked_from_the_start_are_the_oracle_merge(sampler: MaskedSampler) -> None:
    net, x = network(), prompts()
    for row in range(len(x)):
        prompt = x[row : row + 1]
        reference, _ = run(sampler, net, prompt)
        assert walk_labels(net, prompt, reference) == oracle_groups(net, prompt, reference, M, 0)


def test_rollback_steps_are_uniform_over_each_trajectory() -> None:
    steps = torch.tensor([1, 3, 0, 50])
    draws = torch.stack([draw_rollback(steps, torch.Generator().manual_seed(s)) for s in range(400)])
    assert draws[:, 0].eq(0).all() and draws[:, 2].eq(0).all()
    assert set(draws[:, 1].tolist()) == {0, 1, 2} and draws[:, 3].max() == 49 and draws.min() == 0


# -- the online sampler -------------------------------------------------------------------------------------


class OracleScorer:
    """A hand-set indicator that scores the oracle's labels perfectly for one reference trajectory."""

    def __init__(self, reference: Sampled) -> None:
        self.reference = reference

    def __call__(self, masked: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        tokens, reveal, steps = self.reference.tokens, self.reference.reveal_step, self.reference.steps
        done = torch.where(masked & (reveal >= 0), reveal, 10**9).amin(1)  # the first step still masked
        labels = merge_labels(logits.argmax(-1), tokens, reveal, done, steps)
        return torch.where(labels, INF, -INF)


@pytest.mark.parametrize("base", [TopKSampler(k=1), ThresholdSampler(tau=0.4), EBSampler(gamma=0.5)])
def test_an_indicator_scoring_the_oracle_labels_reaches_the_oracle_floor(base: MaskedSampler) -> None:
    net, x = network(), prompts(rows=6, given=3)
    merged_any = False
    for row in range(len(x)):
        prompt = x[row : row + 1]
        reference, _ = run(base, net, prompt)
        floor = int(oracle_floor(net, prompt, reference, M)[0])
        sampler = NISampler(base=base, epsilon=0.5, indicator_cost=0.0, indicator=OracleScorer(reference))
        sampled, counter = run(sampler, net, prompt)
        assert torch.equal(sampled.tokens, reference.tokens)  # trajectory preserved: the same output
        assert int(sampled.steps[0]) == int(counter.nfe[0]) == floor
        merged_any |= floor < int(reference.steps[0])
    assert merged_any


@pytest.mark.parametrize(
    "base, seed",
    [
        (TopKSampler(k=1), None),
        (TopKSampler(k=2, ordering="entropy"), None),
        (EBSampler(gamma=0.3), None),
        (ThresholdSampler(tau=0.5, block_length=4), None),
        (StepsSampler(steps=3, block_length=5), None),
        (TopKSampler(k=1, ordering="random", temperature=1.0, top_p=0.9), 7),
    ],
)
def test_epsilon_one_is_the_base_sampler_and_so_is_a_silent_indicator(base: MaskedSampler, seed: int | None):
    net, x = network(), prompts()
    expected, base_counter = run(base, net, x, seed)
    silent = NISampler(base=base, epsilon=0.5, indicator=lambda m, *_: torch.full(m.shape, -INF))
    counters = []
    for sampler in (NISampler(base=base, epsilon=1.0, indicator=scorer(net)), silent):
        sampled, counter = run(sampler, net, x, seed)
        for field in ("tokens", "reveal_step", "steps"):
            assert torch.equal(getattr(sampled, field), getattr(expected, field)), field
        assert torch.equal(counter.nfe, base_counter.nfe)
        counters.append(counter)
    assert not counters[0].extra  # at epsilon 1 the indicator is not even run
    assert torch.equal(counters[1].extra["indicator"], counter.nfe.double())  # unknown size: a full forward


def test_epsilon_zero_reveals_each_block_in_one_step() -> None:
    net, x = network(), prompts()
    sampler = NISampler(base=TopKSampler(block_length=4), epsilon=0.0, indicator=scorer(net))
    sampled, _counter = run(sampler, net, x)
    assert sampled.steps.tolist() == [3] * len(x)  # 10 masked positions in blocks of 4, 4, 2
    assert not (sampled.tokens == M).any()


def test_batched_equals_single_and_the_indicator_is_charged_at_its_share() -> None:
    net, x = network(), prompts(rows=6)
    indicator = scorer(net, scale=40.0)
    sampler = NISampler(base=EBSampler(gamma=0.05), epsilon=0.6, indicator=indicator)
    batched, counter = run(sampler, net, x)
    base, _ = run(sampler.base, net, x)
    assert (batched.steps < base.steps).any()  # the indicator does reveal extra positions
    share = sum(p.numel() for p in indicator.indicator.parameters()) / sum(p.numel() for p in net.parameters())
    assert 0 < share < 1
    assert torch.allclose(counter.extra["indicator"], counter.nfe.double() * share)
    assert torch.allclose(counter.cost, counter.nfe.double() * (1 + share))
    for row in range(len(x)):
        single, single_counter = run(sampler, net, x[row : row + 1])
        assert torch.equal(single.tokens[0], batched.tokens[row])
        assert torch.equal(single.reveal_step[0], batched.reveal_step[row])
        assert int(single_counter.nfe[0]) == int(counter.nfe[row])


# -- features and the indicator network ----------------------------------------------------------------------


def test_features_and_indicator_have_the_documented_shapes() -> None:
    net, x = network(), prompts(rows=3)
    logits, hidden = net.forward_with_hidden(x)
    assert torch.equal(logits, net(x)) and hidden.shape == (3, L, 32)
    assert torch.allclose(net.head(hidden), logits)  # the hidden state is the output head's input
    logits = without_mask(logits, M)
    found = features(net.embed, logits, hidden, top_tokens=2, top_probs=3)
    assert found.token_embeddings.shape == (3, L, 2, 32)
    assert found.hidden.shape == (3, L, 32) and found.top_probs.shape == (3, L, 3)
    assert (found.top_probs[..., :-1] >= found.top_probs[..., 1:]).all()  # descending
    assert torch.equal(found.token_embeddings[..., 0, :], net.embed(logits.argmax(-1)))  # top-1: the choice
    indicator = IndicatorConfig(top_tokens=2, top_probs=3, width=16).build(32, V)
    assert indicator(found).shape == (3, L, 2)
    flat = Features(found.token_embeddings[0], found.hidden[0], found.top_probs[0])  # [N] positions
    assert indicator(flat).shape == (L, 2) and indicator.log_odds(flat).shape == (L,)
    masked = x == M
    scores = IndicatorScorer(indicator, net.embed)(masked, logits, hidden)
    assert scores.shape == (3, L) and torch.isfinite(scores[masked]).all() and (scores[~masked] == -INF).all()


# -- configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: NISampler(epsilon=1.5), r"epsilon=1.5 must lie in \[0, 1\]"),
        (lambda: NISampler(epsilon=-0.1), r"epsilon=-0.1 must lie in \[0, 1\]"),
        (lambda: NISampler(indicator="no/such.pt"), "indicator must be a loaded scorer"),
        (lambda: NISampler(indicator_cost=-1.0), "indicator_cost=-1.0 must be >= 0 or null"),
        (lambda: NISampler(base=P2Sampler()), "base=P2Sampler.*expected MaskedSampler"),
        (lambda: IndicatorConfig(top_tokens=0), "top_tokens=0 must be >= 1"),
        (lambda: IndicatorConfig(n_blocks=-1), "n_blocks=-1 must be >= 0"),
        (lambda: IndicatorConfig(dropout=1.0), r"dropout=1.0 must be in \[0, 1\)"),
        (lambda: IndicatorConfig(top_probs=9).build(32, V), "top_probs=9 exceeds the 8 predictable tokens"),
        (lambda: TrajectoryConfig(checkpoint="no/such.pt"), "checkpoint=no/such.pt: no such file"),
        (lambda: TrajectoryConfig(checkpoint=__file__, split="dev"), "split='dev' is not one of train, val"),
        (lambda: TrajectoryConfig(checkpoint=__file__, split="test"), "split=.test.: NI is scored on the test split"),
        (lambda: TrajectoryConfig(checkpoint=__file__, shard_size=0), "shard_size=0 must be >= 1"),
        (lambda: NISampler().sample(ForwardCounter(network(), 1), prompts(1), M), "needs an indicator"),
        (lambda: NISampler(indicator_cost=0.0, indicator=OracleScorer(None)).sample(
            ForwardCounter(torch.nn.Identity(), 1), prompts(1), M), "does not provide hidden_states"),
    ],
)
def test_bad_settings_are_one_clear_error(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize("option", ["ni", "ni_eb", "ni_threshold"])
def test_presets_build_and_bad_values_name_the_group(option: str) -> None:
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={option}"]).sampler, "sampler")
    assert isinstance(sampler, NISampler) and isinstance(sampler.base, MaskedSampler)
    for override, message in [("sampler.epsilon=2", "sampler: epsilon=2 must lie in"),
                              ("sampler.base.top_p=0", "sampler: top_p=0 must lie in")]:
        with pytest.raises(ConfigError, match=message):
            build(compose_config("evaluate", ["ckpt=x.pt", f"sampler={option}", override]).sampler, "sampler")


@pytest.mark.parametrize("option", ["ni", "prophet"])
def test_the_base_sampler_is_swapped_from_the_command_line(option: str) -> None:
    overrides = ["ckpt=x.pt", f"sampler={option}", "sampler@sampler.base=threshold", "sampler.base.tau=0.7"]
    sampler = build(compose_config("evaluate", overrides).sampler, "sampler")
    assert type(sampler.base).__name__ == "ThresholdSampler" and sampler.base.tau == 0.7


def test_an_indicator_is_refused_on_another_base_network(tmp_path: Path) -> None:
    net = network()
    save_indicator(scorer(net).indicator, net, tmp_path / "indicator.pt", extra={"base_checkpoint": "net-1"})
    assert load_indicator(tmp_path / "indicator.pt").extra["base_checkpoint"] == "net-1"
    config = {"_target_": NI, "indicator": str(tmp_path / "indicator.pt"), "epsilon": 0.5}
    run(build_sampler(config, net), net, prompts(2))  # the network it was trained on
    with pytest.raises(CheckpointError, match="was trained on net-1; this base network differs"):
        build_sampler(config, network(seed=2))
    with pytest.raises(CheckpointError, match="sampler.indicator: checkpoint not found: no/such.pt"):
        build_sampler({**config, "indicator": "no/such.pt"})  # before any network is loaded
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_indicator(tmp_path / "other.pt")


# -- offline pipeline on tiny data ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Sudoku MDM as a slim checkpoint."""
    path = tmp_path_factory.mktemp("base") / "model.pt"
    torch.manual_seed(0)
    module = MDMModule.from_config(to_container(compose_config("train", TINY)))
    save_slim(module.config, module.ema.shadow, path)
    return path


def test_trajectories_are_sharded_resumable_and_those_of_the_sampler(tiny_base: Path, tmp_path: Path) -> None:
    from mdmkit.io.checkpoint import TrainedModel

    config = TrajectoryConfig(checkpoint=str(tiny_base), n_examples=9, shard_size=4, batch_size=3,
                              root=str(tmp_path), progress=False)
    trained = TrainedModel(tiny_base)
    task = trained.task
    directory = build_trajectories(config, task)
    assert sorted(p.name for p in directory.glob("shard-*")) == ["shard-00000", "shard-00001", "shard-00002"]
    assert json.loads((directory / "meta.json").read_text())["mask_id"] == task.mask_id
    first = load_trajectories(directory)
    assert len(first) == 12 and len(load_trajectories(directory, 9)) == 9  # whole shards; first n if asked
    shutil.rmtree(directory / "shard-00001")  # as if killed while this shard was being written
    (directory / ".shard-00001.partial").mkdir()
    assert build_trajectories(config, task) == directory
    again = load_trajectories(directory)
    for name in ("tokens", "reveal_step", "steps", "index", "correct"):
        assert torch.equal(getattr(again, name), getattr(first, name)), name
    assert not list(directory.glob(".*partial"))

    split = task.load_splits()["train"]
    assert first.index.tolist() == list(range(12))
    target, answer = split.tokens[:4], split.answer_mask[:4]
    prompt = target.masked_fill(answer, task.mask_id)
    expected = TopKSampler(k=1).sample(ForwardCounter(trained.network(task), 4), prompt, task.mask_id)
    assert torch.equal(first.tokens[:4], expected.tokens)
    assert torch.equal(first.reveal_step[:4], expected.reveal_step)
    assert torch.equal(first.prompts(task.mask_id)[:4], prompt)
    assert first.sampled().partition(0) == expected.partition(0)
    assert first.steps[:4].tolist() == answer.sum(1).tolist()  # full-step: one step per blank


def train_indicator(base: Path, out: Path, *overrides: str) -> dict:
    from mdmkit.training.indicator.train import run_indicator_training
    from mdmkit.training.preflight import plan_training

    cfg = compose_config("train", [
        "experiment=sudoku_indicator", *TINY, f"trajectories.checkpoint={base}", "trajectories.n_examples=24",
        "trajectories.shard_size=12", "trajectories.batch_size=24", "trajectories.progress=false",
        f"trajectories.root={out.parent}/trajectories", "data.val_examples=8", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "trainer.log_every_n_steps=1", "eval_limit=8", "indicator.width=8",
        "sampler.epsilon=0.5", f"results_file={out}/results.jsonl", *overrides,
    ])
    return run_indicator_training(plan_training(cfg), out)


def test_indicator_training_runs_end_to_end_and_its_checkpoint_samples(tiny_base: Path, tmp_path: Path):
    summary = train_indicator(tiny_base, tmp_path)
    assert summary["global_step"] == 3 and summary["n"] == 8 and 0 < summary["share"] < 1
    assert summary["extra_cost_mean"]["indicator"] == pytest.approx(summary["nfe_mean"] * summary["share"])
    record = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert record["kind"] == "indicator" and record["sampler"]["indicator"] == str(tmp_path / "indicator.pt")
    metrics = (next((tmp_path / "csv").glob("version_*/metrics.csv"))).read_text().splitlines()[0].split(",")
    for name in ("train/loss", "val/precision", "val/recall", "val/ni_agreement", "val/oracle_nfe"):
        assert name in metrics, name

    from mdmkit.io.checkpoint import TrainedModel

    trained = TrainedModel(tiny_base)
    test = trained.task.load_splits()["test"].head(4)
    prompt = test.tokens.masked_fill(test.answer_mask, trained.task.mask_id)
    network = trained.network()
    sampler = build_sampler({"_target_": NI, "indicator": str(tmp_path / "indicator.pt"), "epsilon": 0.5}, network)
    counter = ForwardCounter(network, len(prompt))
    sampled = sampler.sample(counter, prompt, trained.task.mask_id)
    assert not (sampled.tokens == trained.task.mask_id).any() and (counter.extra["indicator"] > 0).all()

    # a sweep names the indicator by path, as scripts/ni_pipeline.py does: checked when the grid expands, loaded
    # for the model when the row runs
    sweep = {"name": "ni", "entries": [{"sampler": "ni", "grid": {"epsilon": [0.5, 0.9],
                                                                  "indicator": [str(tmp_path / "indicator.pt")]}}]}
    cfg = compose_config("evaluate", [f"ckpt={tiny_base}", "limit=4", f"results_file={tmp_path}/sweep.jsonl",
                                      "wandb.mode=disabled"])
    with open_dict(cfg):
        cfg.sweep = sweep
    rows = run_evaluation(plan_evaluation(cfg), None)
    assert [row["params"]["epsilon"] for row in rows] == [0.5, 0.9] and all(row["n"] == 4 for row in rows)
    sweep["entries"][0]["grid"]["indicator"] = ["no/such.pt"]
    with pytest.raises(CheckpointError, match="sampler.indicator: checkpoint not found: no/such.pt"):
        expand(sweep)


def test_indicator_training_resumes_exactly(tiny_base: Path, tmp_path: Path) -> None:
    common = ["trainer.max_steps=4", "trainer.val_check_interval=2", "evaluate_after_training=false"]
    train_indicator(tiny_base, tmp_path / "straight", *common)
    train_indicator(tiny_base, tmp_path / "interrupted", *common, "checkpoint_every=2")
    midway = tmp_path / "interrupted" / "checkpoints" / "step0000002.ckpt"
    resumed = train_indicator(tiny_base, tmp_path / "resumed", *common, f"ckpt_path={midway}")
    assert resumed["global_step"] == 4
    straight = load_indicator(tmp_path / "straight" / "indicator.pt").indicator.state_dict()
    weights = load_indicator(tmp_path / "resumed" / "indicator.pt").indicator.state_dict()
    for name, weight in straight.items():
        assert torch.equal(weight, weights[name]), name

    from mdmkit.io.checkpoint import TrainedModel

    for indicator in (midway, tmp_path / "straight" / "indicator.pt"):  # given as ckpt=: one line, not the model's
        with pytest.raises(CheckpointError, match=r"is an NI indicator, not a model \(an indicator is given as"):
            TrainedModel(indicator)


def test_too_few_trajectories_for_validation_stop_before_any_is_recorded(tiny_base: Path, tmp_path: Path) -> None:
    """It used to fail only once the trajectories were recorded: minutes to hours on a paper-scale model."""
    with pytest.raises(ConfigError, match="data.val_examples=24 leaves no training trajectories of "
                                          "trajectories.n_examples=24"):
        train_indicator(tiny_base, tmp_path / "run", "data.val_examples=24")
    assert not (tmp_path / "trajectories").exists()


def test_ni_on_a_network_without_hidden_states_is_one_line_before_the_indicator_loads(tmp_path: Path) -> None:
    from mdmkit.core.config import option
    from mdmkit.core.errors import CapabilityError

    speculative = build(option("model", "speculative_tiny"), "model", vocab_size=11, max_len=89).build()
    indicator = tmp_path / "indicator.pt"
    indicator.write_bytes(b"never read")  # the capability check comes first
    config = {**option("sampler", "ni"), "indicator": str(indicator)}
    with pytest.raises(CapabilityError, match="needs hidden_states"):
        build_sampler(config, speculative)

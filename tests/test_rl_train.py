"""`train.py experiment=<task>_rl`: the plan (RL settings built and checked before Lightning), a short run end to
end on a tiny network (rollouts, rewards, updates, validation, model.pt, the test evaluation), and the refusals
each in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, compose_config, run_cli

from mdmkit.core.errors import ConfigError
from mdmkit.objectives.rl import CoupledEstimator, GRPOLoss, SandwichEstimator, SPGLoss, WD1Loss
from mdmkit.samplers import ThresholdSampler
from mdmkit.training.preflight import RLParts, plan_training

SMALL = [*TINY, "init_from=null", "data.batch_size=2", "data.val_examples=8", "rl.group_size=4", "eval_limit=8"]


def _plan(tmp_path: Path, *overrides: str, experiment: str = "sudoku_rl") -> object:
    return plan_training(compose_config("train", [f"experiment={experiment}", *SMALL,
                                                  f"results_file={tmp_path}/results.jsonl", *overrides]))


def test_each_rl_experiment_plans_an_rl_run_from_its_checkpoint(tmp_path: Path) -> None:
    for experiment in ("sudoku_rl", "maze_rl", "arithmetic_rl"):
        plan = plan_training(compose_config("train", [f"experiment={experiment}", f"results_file={tmp_path}/r.jsonl"]))
        assert plan.kind == "rl" and isinstance(plan.parts, RLParts)
        assert plan.run.init_from == f"checkpoints/{experiment.removesuffix('_rl')}_mdm.pt"
        assert plan.notes and plan.notes[0].startswith("rl: 8 prompts x 8 rollouts per step")
    plan = _plan(tmp_path, "rl=wd1")
    assert isinstance(plan.parts, RLParts) and isinstance(plan.parts.rl.loss, WD1Loss)
    assert isinstance(plan.parts.rl.sampler, ThresholdSampler) and plan.parts.rl.sampler.temperature == 1.0
    coupled = _plan(tmp_path, "rl=coupled").parts
    assert isinstance(coupled, RLParts) and isinstance(coupled.rl.estimator, CoupledEstimator)
    assert isinstance(coupled.rl.loss, GRPOLoss)
    spg = _plan(tmp_path, "rl=spg").parts
    assert isinstance(spg, RLParts) and isinstance(spg.rl.estimator, SandwichEstimator)
    assert isinstance(spg.rl.loss, SPGLoss) and not spg.rl.scale_advantages and not spg.rl.keeps_reference


@pytest.mark.usefixtures("one_thread")
def test_an_rl_run_trains_saves_and_evaluates(tmp_path: Path) -> None:
    from mdmkit.training.rl.train import run_rl_training

    plan = _plan(tmp_path, "rl.inner_updates=2", "+reward@rl.rewards.nfe=nfe_charge")
    summary = run_rl_training(plan, tmp_path)  # type: ignore[arg-type]
    assert summary["global_step"] == 4 and "accuracy" in summary
    assert (tmp_path / "model.pt").is_file()
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize(("override", "said"), [
    ("rl.group_size=1", "error: rl: group_size=1: a group of one has no baseline"),
    ("~rl.rewards.verified", "error: rl.rewards is empty: name at least one reward"),
    ("rl.estimator.samples=3", None),
])
def test_bad_rl_settings_stop_before_training_in_one_line(tmp_path: Path, override: str, said: str | None) -> None:
    if said is None:  # a key the chosen estimator does not have: Hydra refuses it
        with pytest.raises(Exception, match="samples"):
            _plan(tmp_path, override)
        return
    with pytest.raises(ConfigError) as error:
        _plan(tmp_path, override)
    assert f"error: {error.value}".startswith(said)


def test_the_command_line_runs_an_rl_experiment(tmp_path: Path) -> None:
    out = run_cli("train.py", "experiment=maze_rl", *SMALL, "trainer.max_steps=2", "rl=wd1",
                  f"results_file={tmp_path}/results.jsonl", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rl: 2 prompts x 4 rollouts per step by threshold-confidence" in out.stdout
    assert "WD1Loss (beta=0)" in out.stdout
    assert list(tmp_path.glob("outputs/maze_rl/*/model.pt"))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("inner_updates", "first", "total"), [(1, 2, 4), (2, 3, 4)])
def test_a_resumed_rl_run_ends_where_an_uninterrupted_one_does(tmp_path: Path, inner_updates: int, first: int,
                                                               total: int) -> None:
    """Rollouts and masks are functions of (seed, step, rank), the reference travels in the checkpoint: `first`
    steps then the rest from last.ckpt give the weights `total` steps give. With mu = 2 the run stops after step
    3's first inner update: the rollouts, advantages and old policy's estimates it held travel in the checkpoint,
    and the resumed step 4 is that batch's second inner update, as in the uninterrupted run."""
    import torch

    from mdmkit.training.rl.train import run_rl_training

    def run(directory: Path, *overrides: str) -> dict[str, torch.Tensor]:
        plan = _plan(directory, "evaluate_after_training=false", f"rl.inner_updates={inner_updates}", *overrides)
        run_rl_training(plan, directory)  # type: ignore[arg-type]
        return torch.load(directory / "model.pt", weights_only=False)["network"]

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    run(tmp_path / "a", f"trainer.max_steps={first}")
    resumed = run(tmp_path / "a", f"trainer.max_steps={total}", f"ckpt_path={tmp_path}/a/checkpoints/last.ckpt")
    straight = run(tmp_path / "b", f"trainer.max_steps={total}")
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_accumulating_two_batches(tmp_path: Path) -> None:
    """Each rank rolls out the batch the data stream gives it, from that batch's own seed: data parallel over 2 CPU
    processes gives the weights of 1 process accumulating 2 micro-batches, step by step."""
    import torch

    common = ["experiment=sudoku_rl", *SMALL, "trainer.max_steps=3", "checkpoint_every=1",
              "evaluate_after_training=false", "+reward@rl.rewards.cells=answer_accuracy", "optim.weight_decay=0",
              f"results_file={tmp_path}/results.jsonl"]
    runs = {}
    for name, extra in {"ddp": ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
                        "accumulated": ["trainer.accumulate_grad_batches=2"]}.items():
        out = run_cli("train.py", *common, *extra, f"run_name={name}", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        files = sorted(next((tmp_path / "outputs" / name).iterdir()).glob("checkpoints/step*.ckpt"))
        runs[name] = [torch.load(file, map_location="cpu", weights_only=False)["state_dict"] for file in files]
    assert len(runs["ddp"]) == len(runs["accumulated"]) == 3
    for step, (ddp, accumulated) in enumerate(zip(runs["ddp"], runs["accumulated"]), 1):
        for name in ddp:
            assert torch.allclose(ddp[name], accumulated[name], atol=1e-6, rtol=1e-5), (step, name)
    # the dense reward's advantages train the network (no weight decay: a change is the policy gradient's)
    assert any(not torch.equal(runs["ddp"][0][name], runs["ddp"][2][name]) for name in runs["ddp"][0])


def test_a_held_experience_round_trips_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    """What a checkpoint saved between inner updates keeps (a text task's rollouts: texts, documents, padding) is
    plain data that `torch.load(weights_only=True)` reads back whole."""
    import torch

    from mdmkit.training.rl.rewards import RewardResult
    from mdmkit.training.rl.rollout import Rollouts
    from mdmkit.training.rl.step import Experience

    tokens = torch.tensor([[5, 1, 2], [5, 2, 9]])
    rollouts = Rollouts(tokens, tokens.clone(), torch.tensor([[False, True, True]] * 2), torch.tensor([3, 4]), 9, 2,
                        ["a", "b"], [{"question": "q", "answer": 1}] * 2, torch.ones(2, 3, dtype=torch.bool))
    held = Experience(rollouts, RewardResult(torch.tensor([1.0, 0.0]), {"verified": torch.tensor([1.0, 0.0])}, []),
                      torch.tensor([0.7, -0.7]), [11, 12], [torch.randn(2, 3), torch.randn(2, 3)], None)
    torch.save({"kept": held.state()}, tmp_path / "state.pt")
    back = Experience.from_state(torch.load(tmp_path / "state.pt", weights_only=True)["kept"], torch.device("cpu"))
    for name in ("tokens", "target", "answer_mask", "nfe", "attention"):
        assert torch.equal(getattr(back.rollouts, name), getattr(rollouts, name))
    assert (back.rollouts.mask_id, back.rollouts.group_size) == (9, 2)
    assert list(back.rollouts.texts or ()) == ["a", "b"] and back.rollouts.docs == rollouts.docs
    assert torch.equal(back.rewards.parts["verified"], held.rewards.parts["verified"])
    assert back.mask_seeds == [11, 12] and back.ref is None and back.old is not None and held.old is not None
    assert all(torch.equal(a, b) for a, b in zip(back.old, held.old))

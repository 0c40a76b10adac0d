"""`train.py experiment=<task>_rl`: the plan (RL settings built and checked before Lightning), a short run end to
end on a tiny network (rollouts, rewards, updates, validation, model.pt, the test evaluation), and the refusals
each in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, compose_config, run_cli

from mdmkit.core.errors import ConfigError
from mdmkit.objectives.rl import CoupledEstimator, GRPOLoss, WD1Loss
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
def test_a_resumed_rl_run_ends_where_an_uninterrupted_one_does(tmp_path: Path) -> None:
    """Rollouts and masks are functions of (seed, step, rank), the reference travels in the checkpoint: two steps
    then two more from last.ckpt give the weights four steps give (one inner update per collection)."""
    import torch

    from mdmkit.training.rl.train import run_rl_training

    def run(directory: Path, *overrides: str) -> dict[str, torch.Tensor]:
        plan = _plan(directory, "evaluate_after_training=false", *overrides)
        run_rl_training(plan, directory)  # type: ignore[arg-type]
        return torch.load(directory / "model.pt", weights_only=False)["network"]

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    run(tmp_path / "a", "trainer.max_steps=2")
    resumed = run(tmp_path / "a", "trainer.max_steps=4", f"ckpt_path={tmp_path}/a/checkpoints/last.ckpt")
    straight = run(tmp_path / "b", "trainer.max_steps=4")
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)


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

"""Every config composes and builds; bad keys and values stop at start-up with one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, compose_config, run_cli
from hydra.errors import ConfigCompositionException

from mdmkit.core.config import build, to_container
from mdmkit.core.errors import ConfigError
from mdmkit.training.module import MDMModule
from mdmkit.training.run_config import DataConfig

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_instantiates(experiment: str, tmp_path: Path) -> None:
    if compose_config("train", [f"experiment={experiment}"]).get("sft") is not None:
        # a pretrained LLM's fine-tuning (or RL): everything but the model, which is the user's directory
        from mdmkit.training.sft.config import build_sft_parts

        (tmp_path / "config.json").write_text("{}")
        overrides = [f"experiment={experiment}", f"sft.model={tmp_path}"]
        build_sft_parts(to_container(compose_config("train", overrides)))
        return
    cfg = compose_config("train", [f"experiment={experiment}"])
    module = MDMModule.from_config(to_container(cfg))  # task, network, objective, optimizer, val sampler
    assert module.network.num_parameters() > 0
    assert build(cfg.sampler, "sampler") is not None
    for name, node in cfg.logger.items():
        assert node._target_.startswith("lightning.pytorch.loggers"), name


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "trainer").glob("*.yaml")))
def test_every_trainer_config_composes(option: str) -> None:
    cfg = compose_config("train", [f"trainer={option}"])
    assert cfg.trainer._target_ == "lightning.Trainer"


def test_evaluate_config_composes_with_and_without_task() -> None:
    assert compose_config("evaluate", ["ckpt=x.pt"]).get("task") is None
    assert compose_config("evaluate", ["ckpt=x.pt", "task=maze"]).task.grid_size == 4


def test_model_sizes_match_their_names() -> None:
    sizes = {}
    for name in ("tiny", "cpu", "paper"):
        module = MDMModule.from_config(to_container(compose_config("train", [f"model={name}"])))
        sizes[name] = module.network.num_parameters()
    assert sizes["tiny"] < 50_000
    assert 0.5e6 < sizes["cpu"] < 1.2e6
    assert 5e6 < sizes["paper"] < 7.5e6


def test_the_deep_paper_variant_differs_from_the_paper_model_in_depth_alone() -> None:
    """experiment=sudoku_paper_deep and its NI and sweep configs are sudoku_paper's with twice the layers at about
    the same parameter count, under names of their own (tools/device/device_paper.sh and device_ni.sh derive them)."""
    def both(config_name: str, group: str, option: str, *fixed: str) -> list[dict]:
        names = [option.format(model) for model in ("sudoku_paper", "sudoku_paper_deep")]
        configs = [to_container(compose_config(config_name, [*fixed, f"{group}={name}"])) for name in names]
        for config, name in zip(configs, names):
            if "run_name" in config:  # the run's name, and the wandb run's, which is ${run_name}
                assert config.pop("run_name") == config["logger"].pop("wandb")["name"] == name
        return configs

    paper, deep = both("train", "experiment", "{}")
    paper_model, deep_model = paper.pop("model"), deep.pop("model")
    assert deep == paper and deep_model["n_layers"] == 2 * paper_model["n_layers"]
    modules = [MDMModule.from_config(to_container(compose_config("train", [f"experiment={name}"])))
               for name in ("sudoku_paper", "sudoku_paper_deep")]
    sizes = [module.network.num_parameters() for module in modules]
    assert abs(sizes[1] / sizes[0] - 1) < 0.1
    paper, deep = both("train", "experiment", "{}_indicator")
    assert deep["trajectories"].pop("checkpoint") == "checkpoints/sudoku_paper_deep.pt"
    assert paper["trajectories"].pop("checkpoint") == "checkpoints/sudoku_paper.pt"
    assert deep == paper
    paper, deep = (config["sweep"] for config in both("evaluate", "sweep", "{}_fronts", "ckpt=x.pt"))
    assert (paper.pop("name"), deep.pop("name")) == ("sudoku_paper_fronts", "sudoku_paper_deep_fronts")
    assert deep == paper


def test_unknown_key_and_group_option_are_rejected_at_composition() -> None:
    with pytest.raises(ConfigCompositionException, match="n_layer"):
        compose_config("train", ["model.n_layer=3"])
    with pytest.raises(ConfigCompositionException, match="huge"):
        compose_config("train", ["model=huge"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_layers=0", "model: n_layers=0 must be >= 1"),
        ("model.d_model=130", "model: d_model=130 must be divisible by n_heads=4"),
        ("model.positions=sinusoidal", "model: positions='sinusoidal': expected one of 'learned', 'rotary'"),
        ("sampler.k=0", "sampler: k=0 must be >= 1"),
        ("task.n_givens=18", "task: n_givens=18 must lie in [22, 80]: random digging rarely reaches"),
        ("task.n_givens=[40,20]", "task: n_givens=[40, 20] is a range [lo, hi] with lo <= hi"),
        ("objective.weighting=sqrt", "objective: weighting='sqrt'"),
        ("optim.lr=-1", "optim: lr=-1 must be > 0"),
        ("+model.flash=true", "model: unknown key 'flash'"),
    ],
)
def test_bad_values_raise_one_config_error(override: str, message: str) -> None:
    cfg = compose_config("train", [override])
    with pytest.raises(ConfigError) as error:
        MDMModule.from_config(to_container(cfg))
        build(cfg.sampler, "sampler")
    assert message in str(error.value)


def test_wrong_type_is_reported_with_the_field() -> None:
    cfg = compose_config("train", ["model.n_heads=four"])
    with pytest.raises(ConfigError, match="n_heads='four': expected int"):
        MDMModule.from_config(to_container(cfg))


def test_cli_prints_one_line_error_without_traceback(tmp_path: Path) -> None:
    result = run_cli("train.py", *TINY, "model.n_layers=0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: model: n_layers=0 must be >= 1"
    assert "Traceback" not in result.stderr + result.stdout
    assert [p.name for p in (tmp_path / "outputs" / "quickstart").iterdir()] == []  # Hydra's record went too
    for kept, mine in ((tmp_path / "notes", "notes.txt"), (tmp_path / "folder", "checkpoints")):  # not its own
        kept.mkdir()
        if mine.endswith(".txt"):
            (kept / mine).write_text("mine")
        else:
            (kept / mine).mkdir()
        assert run_cli("train.py", "model.n_layers=0", f"hydra.run.dir={kept}", cwd=tmp_path).returncode == 2
        assert (kept / mine).exists() and (kept / ".hydra" / "config.yaml").is_file()


def test_cli_unknown_key_is_one_clear_message(tmp_path: Path) -> None:
    result = run_cli("train.py", "model.n_layer=3", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip() == ("error: model.n_layer: model has no key 'n_layer' (did you mean model.n_layers? "
                                     "valid: _target_, d_model, dropout, mlp_ratio, n_heads, n_layers, positions)")
    top = run_cli("train.py", "sed=3", cwd=tmp_path)  # a top-level key's suggestion has no leading dot
    assert top.returncode != 0 and "error: sed: train has no key 'sed' (did you mean seed? valid: " in top.stderr


@pytest.mark.parametrize("override, message", [
    ("limit=abc", "limit=abc must be an integer >= 1 or null"),
    ("limit=2.5", "limit=2.5 must be an integer >= 1 or null"),
    ("batch_size=abc", "batch_size=abc must be an integer >= 1"),
    ("seed=abc", "seed=abc must be an integer >= 0"),
    ("resume=no", "resume=no must be true or false"),
    ("oracle=maybe", "oracle=maybe must be true or false"),
    ("results_file=/proc/rows.jsonl", "results_file=/proc/rows.jsonl cannot be written"),
])
def test_evaluate_top_level_settings_are_typed_before_the_model_loads(override: str, message: str,
                                                                      tmp_path: Path) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    cfg = compose_config("evaluate", [f"ckpt={tmp_path}/absent.pt", f"results_file={tmp_path}/rows.jsonl", override])
    with pytest.raises(ConfigError, match=message):  # before the (missing) checkpoint is looked for
        run_evaluation(plan_evaluation(cfg), tmp_path)


@pytest.mark.parametrize("override, message", [
    ("eval_limit=0", "eval_limit=0 must be >= 1 or null"),
    ("eval_limit=abc", "eval_limit='abc': expected int \\| None"),
    ("data.val_examples=x", "data: val_examples='x': expected int"),
    ("results_file=/proc/rows.jsonl", "results_file=/proc/rows.jsonl cannot be written"),
])
def test_training_settings_used_after_training_are_checked_before_it(override: str, message: str) -> None:
    from mdmkit.training.preflight import check_run

    with pytest.raises(ConfigError, match=message):
        check_run(compose_config("train", [override]))


def components(overrides: list[str]) -> tuple[dict[str, Any], DataConfig]:
    """What `build_parts` takes: a training config and its data settings."""
    config = to_container(compose_config("train", overrides))
    return config, DataConfig.from_config(config["data"])


def test_an_objective_for_another_kind_of_network_is_refused_at_start_up() -> None:
    from mdmkit.training.preflight import build_parts

    with pytest.raises(ConfigError, match="objective SpeculativeLoss trains a SpeculativeConfig network, not the "
                                          "TransformerConfig of this model: pick model=speculative_"):
        build_parts(*components(["experiment=sudoku_speculative", "model=tiny"]))
    build_parts(*components(["experiment=sudoku_speculative"]))


def test_a_frozen_trunk_needs_a_trained_model_to_start_from() -> None:
    from mdmkit.training.preflight import build_parts

    with pytest.raises(ConfigError, match="freeze_noncausal=true trains the causal head on a frozen trunk"):
        build_parts(*components(["experiment=sudoku_speculative_head", "init_from=null"]))


def test_a_typo_under_data_is_refused_not_dropped() -> None:
    from mdmkit.training.preflight import check_run

    with pytest.raises(ConfigError, match=r"data: unknown key\(s\) \['augmnt'\] \(valid: augment, batch_size"):
        check_run(compose_config("train", ["+data.augmnt=true"]))


def test_identity_keeps_only_what_differs_from_the_defaults_typed_by_the_fields() -> None:
    """Results keys hash `identity`: equal settings written differently are one sampler."""
    from mdmkit.core.config import identity, option

    eb = option("sampler", "eb")
    assert identity(eb) == {"_target_": "mdmkit.samplers.EBSampler"}  # every field at its default
    assert identity({**eb, "gamma": 1}) == identity({**eb, "gamma": 1.0}) == identity(
        {"_target_": "mdmkit.samplers.EBSampler", "gamma": 1.0})  # an int where a float is typed; fields left out
    assert identity({**eb, "gamma": 1})["gamma"] == 1.0 and isinstance(identity({**eb, "gamma": 1})["gamma"], float)
    assert identity({**eb, "block_length": 32}) != identity(eb)  # int | None stays an int, and counts
    topk = option("sampler", "topk")
    assert identity({**topk, "k": 2})["k"] == 2 and isinstance(identity({**topk, "k": 2})["k"], int)
    assert identity({**eb, "stop_early": 1}) != identity(eb)  # 1 is not True: the sampler would refuse it
    floor = {"name": "oracle", "reference": {**eb, "gamma": 1}}  # nested nodes alike; a dict without a target kept
    assert identity(floor) == {"name": "oracle", "reference": {"_target_": "mdmkit.samplers.EBSampler", "gamma": 1.0}}
    ni = option("sampler", "ni")
    assert identity({**ni, "base": {**ni["base"], "cache": "none"}}) == identity(ni)
    assert identity({"_target_": "no.such.Sampler", "x": 1}) == {"_target_": "no.such.Sampler", "x": 1}

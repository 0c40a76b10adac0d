"""Fine-tuning's first hour on a CPU: the documented command with each bad setting fails in one line naming the key
and the fix, before any model or data loads (no training step, no checkpoint); without `trainer=` it trains on the
CPU, holds out a share of a small pair file, says what it evaluates after training, and ends with a summary of the
run over all its calls."""

from __future__ import annotations

import json
import os
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from conftest import BENCHMARK_DATA, ROOT, run_cli, run_cli_cases
from tiny_text_models import native_checkpoint_dir

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
pytestmark = [
    pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"no reference fixtures at {REFERENCE}"),
    pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_train.jsonl").is_file(), reason=f"no GSM8K at {BENCHMARK_DATA}"),
]
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # a laptop, offline


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaDA (256 positions) with its tokenizer, as a user's local checkpoint directory."""
    return native_checkpoint_dir(REFERENCE / "llada", "llada", tmp_path_factory.mktemp("sft-model") / "llada")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 short GSM8K pairs: a user's first pair file, smaller than the experiment's data.val_examples=64."""
    from mdmkit.tasks.gsm8k import worked_solution

    rows = [json.loads(line) for line in (BENCHMARK_DATA / "gsm8k_train.jsonl").read_text().splitlines()]
    short = [{"prompt": row["question"], "response": worked_solution(row["answer"])} for row in rows
             if len(row["question"]) + len(worked_solution(row["answer"])) < 190][:20]
    path = tmp_path_factory.mktemp("sft-pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(pair) + "\n" for pair in short))
    return path


def documented(model_dir: Path, pairs: Path, *extra: str) -> list[str]:
    """docs/finetuning.md's command on the user's pairs, sized for the tiny model (no trainer=: the experiment's)."""
    return ["experiment=llada_sft", f"sft.model={model_dir}", f"sft.train_file={pairs}", "sft.max_length=256",
            f"task.data_dir={BENCHMARK_DATA}", "task.max_gen_len=16", "logger=csv", *extra]


OFFLINE = "split is on the hub (openai/gsm8k), but HF_HUB_OFFLINE is set: point task.data_dir at a directory with " \
    "gsm8k_test.jsonl, gsm8k_train.jsonl, or "
BAD = {  # a case: its overrides of the documented command, what its one line says
    "no model": (["sft.model=???"], "sft.model has no value (??? in its config): give it on the command line"),
    "a GPU trainer": (["trainer=gpu"], "trainer: accelerator=gpu, but "),
    "too long": (["sft.max_length=1024"], "sft.max_length=1024 is more than the 256 positions of "),
    "GSM8K offline": (["sft.train_file=null", "task.data_dir=null"],
                      f"gsm8k: its train {OFFLINE}give your pairs as sft.train_file=pairs.jsonl"),
    "evaluation offline": (["task.data_dir=null"], f"gsm8k: its test {OFFLINE}evaluate_after_training=false"),
    "no room for a prompt": (["task.max_gen_len=256"], "which leave no room for a prompt in the 256 positions of"),
    "another kind": (["experiment=dream_sft"], "sft.kind=dream, but "),
    "one pair": (["sft.train_file={one}"],
                 "holds 1 pair: at least 2 are needed (one held out for the validation loss), or give sft.val_file"),
    "a malformed pair": (["sft.train_file={bad}"], 'bad.jsonl:2: expected {"prompt": str, "response": str}'),
}


@pytest.fixture(scope="module")
def bad_runs(model_dir, pairs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, CompletedProcess]]:
    """The documented command with each case's overrides, each in a directory of its own: (the directory, the run)."""
    where = {case: tmp_path_factory.mktemp("bad") for case in BAD}
    runs = {}
    for case, work in where.items():
        (work / "one.jsonl").write_text(pairs.read_text().splitlines()[0] + "\n")
        (work / "bad.jsonl").write_text(pairs.read_text().splitlines()[0] + '\n{"prompt": "q"}\n')
        given = [o.format(one=work / "one.jsonl", bad=work / "bad.jsonl") for o in BAD[case][0]]
        runs[case] = (work, documented(model_dir, pairs, *given))
    done = run_cli_cases("train.py", runs, env=CPU_ONLY)
    return {case: (where[case], done[case]) for case in BAD}


@pytest.mark.parametrize("case", list(BAD))
def test_each_bad_setting_fails_in_one_line_before_anything_loads(bad_runs, case) -> None:
    work, out = bad_runs[case]
    expected = BAD[case][1]
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and expected in errors[0], out.stderr[-2000:]
    assert "parameters" not in out.stdout  # no model was loaded (the banner names its size)
    assert not [*work.rglob("*.ckpt"), *work.rglob("metrics.csv"), *work.rglob("calls.jsonl")]


def test_the_documented_command_trains_on_a_cpu_and_sums_up_the_run(model_dir, pairs, tmp_path: Path) -> None:
    """No trainer=: the CPU, in float32. 20 pairs with data.val_examples=64 hold out 4; the banner says where the
    evaluation's documents come from; the summary counts the steps, time and validation losses of every call."""
    rows = tmp_path / "rows.jsonl"
    out = run_cli("train.py", *documented(model_dir, pairs, "sft.lora_r=4", "trainer.max_steps=2",
                                          "trainer.val_check_interval=1", "eval_limit=1", f"results_file={rows}"),
                  cwd=tmp_path, env=CPU_ONLY)
    assert out.returncode == 0, out.stderr[-3000:]
    run = next((tmp_path / "outputs" / "llada_sft").iterdir())
    assert "data: 16 training pairs, 4 validation pairs (data.val_examples=64 holds out at most a fifth" in out.stdout
    assert (f"on 1 of the 1,319 gsm8k test documents from {BENCHMARK_DATA / 'gsm8k_test.jsonl'} (eval_limit=N for "
            "fewer, evaluate_after_training=false for none)") in out.stdout
    assert "step 1/2 | loss " in out.stdout and "| val loss " in out.stdout
    assert "done: 2 steps, " in out.stdout and " over 1 call | val loss " in out.stdout
    assert f"  adapter: {run / 'adapter'}" in out.stdout and f"  results: {rows}" in out.stdout
    first = json.loads(rows.read_text().splitlines()[-1])
    assert first["config"]["trainer"]["accelerator"] == "auto" and first["config"]["trainer"]["precision"] == "32-true"

    resumed = run_cli("train.py", f"ckpt_path={run}", "trainer.max_steps=4", cwd=tmp_path, env=CPU_ONLY)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    calls = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]
    assert [(call["first_step"], call["global_step"]) for call in calls] == [(0, 2), (2, 4)]
    assert [step for call in calls for step, _ in call["validation"]] == [1, 2, 3, 4]
    assert "done: 4 steps, " in resumed.stdout and " over 2 calls | val loss " in resumed.stdout
    second = json.loads(rows.read_text().splitlines()[-1])
    assert second["train_time_s"] == pytest.approx(sum(call["seconds"] for call in calls))


def test_trainer_auto_takes_the_device_present(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from mdmkit.core.errors import ConfigError
    from mdmkit.training.accelerator import resolve_trainer

    auto = {"accelerator": "auto", "devices": 1, "precision": "auto"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_trainer(auto) == {**auto, "precision": "32-true"}
    with pytest.raises(ConfigError, match="trainer: precision=16-mixed needs a GPU"):
        resolve_trainer({"accelerator": "cpu", "precision": "16-mixed"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_trainer(auto)["precision"] == "bf16-mixed"
    with pytest.raises(ConfigError, match=r"trainer: devices=4, but this machine has 1 GPU\(s\): trainer.devices=1"):
        resolve_trainer({"accelerator": "gpu", "devices": 4, "precision": "bf16-mixed"})


def test_a_small_pair_file_holds_out_a_fifth_and_counts_read_as_words() -> None:
    from omegaconf import OmegaConf

    from mdmkit.core.config import require_given
    from mdmkit.core.errors import ConfigError
    from mdmkit.core.wording import plural, size
    from mdmkit.training.sft.pairs import held_out

    assert [held_out(pairs, 64) for pairs in (2, 9, 20, 320, 10_000)] == [1, 1, 4, 64, 64]
    assert (plural(1, "pair"), plural(1024, "pair")) == ("1 pair", "1,024 pairs")
    sizes = [size(n) for n in (512, 9_472, 231_424, 999_600, 8_030_261_248)]
    assert sizes == ["512", "9.47K", "231K", "1.00M", "8.03B"]
    with pytest.raises(ConfigError, match=r"^sft\.model has no value .* sft\.model=\.\.\. \(also missing: init_from\)"):
        require_given(OmegaConf.create({"sft": {"model": "???", "kind": "llada"}, "init_from": "???"}))


def test_an_adapter_of_another_kind_is_refused_before_the_model_loads(model_dir, tmp_path: Path) -> None:
    from conftest import compose_config

    from mdmkit.core.errors import ConfigError
    from mdmkit.evaluation.plan import plan_evaluation
    from mdmkit.models.llm.adapter_base import RECORD

    adapter = tmp_path / "adapter"  # what a Dream run's adapter/ records of its base
    adapter.mkdir()
    (adapter / RECORD).write_text(json.dumps({"kind": "dream", "base": "/models/dream", "probe": {}}))
    cfg = compose_config("evaluate", ["task=gsm8k", f"ckpt={model_dir}", "hf.kind=llada", f"hf.adapter={adapter}",
                                      f"task.data_dir={BENCHMARK_DATA}", f"results_file={tmp_path}/rows.jsonl"])
    with pytest.raises(ConfigError, match=r"hf.adapter=.* was trained on a dream model \(/models/dream\), not a llada "
                                          r"one: evaluate it on that base, ckpt=<its directory> hf.kind=dream"):
        plan_evaluation(cfg)

"""docs/finetuning.md's CPU example as a user runs it, offline and without the reference fixtures: the documented
command makes a tiny LLaDA and a tiny Dream, the documented fine-tuning command runs a few steps on one, and the
documented evaluations load what it saved (model/, and the base with adapter/)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WAIT_S

from mdmkit.core.errors import ConfigError
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.tiny import make_tiny_model

pytest.importorskip("peft")
DOC = ROOT / "docs" / "finetuning.md"
END_OF_TURN = {"llada": "<|eot_id|>", "dream": "<|im_end|>"}  # conf/sft/<kind>.yaml's end_of_turn


def documented_commands() -> list[list[str]]:
    """The `python ...` commands of docs/finetuning.md's first bash block, each as its words."""
    block = DOC.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words[:1] == ["python"]]


def run(words: list[str], cwd: Path) -> str:
    """A documented command as a user runs it in `cwd`: its output, after asserting it succeeded."""
    import subprocess

    script = words[1] if words[1].endswith(".py") else None
    command = [sys.executable, *([str(ROOT / script)] if script else [words[1]]), *words[2:]]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, timeout=WAIT_S)
    assert done.returncode == 0, " ".join(words) + "\n" + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def commands() -> dict[str, list[str]]:
    found = documented_commands()
    named = {"tiny": [c for c in found if "mdmkit.models.llm.tiny" in c],
             "train": [c for c in found if c[1] == "train.py"], "evaluate": [c for c in found if c[1] == "evaluate.py"]}
    assert len(named["tiny"]) == 1 and len(named["train"]) == 1 and len(named["evaluate"]) == 2, found
    return {"tiny": named["tiny"][0], "train": named["train"][0], "model": named["evaluate"][0],
            "adapter": named["evaluate"][1]}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, commands) -> Path:
    """A user's directory beside the checkout's example data, with both tiny models made by the documented command."""
    cwd = tmp_path_factory.mktemp("user")
    (cwd / "examples").symlink_to(ROOT / "examples")
    llada = commands["tiny"]
    dream = [word.replace("llada", "dream") for word in llada]
    for words in (llada, dream):
        assert "made: " in run(words, cwd)
    return cwd


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_the_documented_command_makes_a_model_with_its_tokenizer(workdir: Path, kind: str) -> None:
    directory = workdir / "models" / f"tiny-{kind}"
    config = json.loads((directory / "config.json").read_text())
    network, tokenizer = load_native(str(directory), kind)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == config["eos_token_id"] == config["pad_token_id"]
    assert network.mask_id == config["mask_token_id"] == len(tokenizer) - 1 == network.config.vocab_size - 1
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 1 + 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("assistant<|end_header_id|>\n\n" if kind == "llada" else "<|im_start|>assistant\n")
    ids = tokenizer(text + "1 + 2 = 3." + END_OF_TURN[kind], add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.convert_tokens_to_ids(END_OF_TURN[kind]) and max(ids) < network.mask_id
    assert tokenizer.decode(ids) == text + "1 + 2 = 3." + END_OF_TURN[kind]


def test_the_same_seed_makes_the_same_model_and_an_existing_directory_is_refused(tmp_path: Path) -> None:
    first, second = make_tiny_model("dream", tmp_path / "a"), make_tiny_model("dream", tmp_path / "b")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    other = make_tiny_model("dream", tmp_path / "c", seed=1)
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="exists and is not empty"):
        make_tiny_model("llada", first)


@pytest.mark.slow
def test_the_documented_fine_tuning_runs_and_its_results_evaluate(workdir: Path, commands) -> None:
    quick = ["trainer.max_steps=2", "trainer.val_check_interval=2", "eval_limit=2", "logger=csv",
             "trainer.enable_progress_bar=false", f"results_file={workdir}/rows.jsonl"]
    out = run([*commands["train"], *quick], workdir)
    assert "saved: " in out and "test documents: accuracy" in out
    run_dir = next((workdir / "outputs" / "llada_sft").iterdir())
    load_native(str(run_dir / "model"), "llada")
    for name in ("model", "adapter"):
        words = [word.replace("outputs/llada_sft/<time>", str(run_dir.relative_to(workdir)))
                 for word in commands[name]]
        assert "accuracy" in run([*words, "limit=2", f"results_file={workdir}/{name}.jsonl"], workdir)
    rows = [json.loads(line) for line in (workdir / "rows.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "sft" and rows[-1]["trained"]["method"] == "lora"

"""DiffusionGemma (`hf.kind=diffusion_gemma`) through the text evaluations: `evaluate.py task=gsm8k` and
`mdmkit-lm-eval --tasks mdmkit_gsm8k` give one answer, document by document, with the kind's own default sampler
(`sampler=diffusion_gemma`, from its record) when none is named, and so do HumanEval and MBPP (their stop phrases, the
sandbox's verdicts); and the ids that end an answer are the network's own (its generation config's, Gemma's
<end_of_turn> beside <eos>), for the sampler's stop and the scored text alike, on both paths.

The model is the tiny random one `python -m mdmkit.models.llm.tiny --kind diffusion_gemma` makes: what is checked is
that each path runs and that both give one answer, not what it answers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from conftest import BENCHMARK_DATA, compose_config
from one_answer import assert_one_answer, generations, lm_eval_samples

from mdmkit.tasks.code import CodeTask, HumanEvalTask, MBPPTask

if TYPE_CHECKING:
    from mdmkit.evaluation.generation import TextModel
    from mdmkit.evaluation.plan import EvaluationPlan

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
GEN, MAX_LENGTH, DOCS = 24, 160, 2  # two canvases of 16, the second cut at the answer's end
CODE_STEPS = 4  # the code tasks' denoising steps a canvas (sampler.max_steps): garbage either way, made sooner


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mdmkit.models.llm.tiny import make_tiny_model

    return make_tiny_model("diffusion_gemma", tmp_path_factory.mktemp("dg") / "model")


@pytest.fixture(scope="module")
def code_model(model_dir: Path) -> TextModel:
    """The tiny model as evaluate.py loads it for the code tasks (their prompts cut to MAX_LENGTH's positions)."""
    from mdmkit import api

    return api.load_text_model(str(model_dir), "diffusion_gemma", max_length=MAX_LENGTH)


def test_the_kind_names_its_own_default_sampler() -> None:
    from mdmkit import api
    from mdmkit.cli.overrides import names_sampler
    from mdmkit.models.llm.registry import model_kind
    from mdmkit.samplers import RevisableSampler

    assert model_kind("diffusion_gemma").default_sampler == "diffusion_gemma"
    assert (model_kind("llada").default_sampler, model_kind("causal").default_sampler) == ("eb", "ntp")
    assert api.kind_sampler("diffusion_gemma", max_steps=4) == RevisableSampler(max_steps=4)
    assert not names_sampler(["task=gsm8k", "hf.kind=diffusion_gemma", "limit=2"])
    assert all(names_sampler([given]) for given in ("sampler=eb", "sampler.max_steps=4", "sampler@sampler.rule=topk"))


@pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                    reason=f"benchmark data not found: {BENCHMARK_DATA}")
def test_evaluate_and_lm_eval_give_one_answer_with_the_kind_s_sampler(model_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    cfg = compose_config("evaluate", [
        "task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0", f"task.max_gen_len={GEN}", f"ckpt={model_dir}",
        "hf.kind=diffusion_gemma", f"hf.max_length={MAX_LENGTH}", f"limit={DOCS}", f"batch_size={DOCS}", "device=cpu",
        f"results_file={tmp_path / 'rows.jsonl'}", "wandb.mode=disabled"])  # no sampler named: the kind's own
    plan = plan_evaluation(cfg, preset="topk", sampler_named=False)
    assert plan.jobs[0].preset == "diffusion_gemma" and plan.config["sampler"] == plan.jobs[0].sampler
    threads = torch.get_num_threads()
    (row,) = run_evaluation(plan)
    torch.set_num_threads(threads)
    assert row["n"] == DOCS and row["nfe"]["min"] >= 1 and row["sampler"]["_target_"].endswith("RevisableSampler")
    assert 1 <= row["extra_cost_mean"]["encoder"] <= 2  # the encoder's passes beside NFE: one a canvas a row needed
    samples = lm_eval_samples(monkeypatch, f"ckpt={model_dir},kind=diffusion_gemma,max_length={MAX_LENGTH}", GEN,
                              DOCS, DOCS, num_fewshot=0)
    ours = generations(tmp_path, row)
    assert_one_answer(samples, ours)
    assert all(doc["generation"] for doc in ours)  # answers with text in them, not two empty ones


def test_an_answer_ends_at_the_network_s_end_ids(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer names <eos> only; the checkpoint's generation config ends a text at <eos> or <end_of_turn>, as
    its sampler does: the scored text is cut at whichever comes first. A masked network states none: the
    tokenizer's end-of-text token is the one."""
    from mdmkit import api
    from mdmkit.evaluation.generation import TextModel

    model = api.load_text_model(str(model_dir), "diffusion_gemma")
    tokenizer, net = model.tokenizer, model.network
    eos, end_of_turn = tokenizer.convert_tokens_to_ids(["<eos>", "<end_of_turn>"])
    assert tokenizer.eos_token_id == eos and model.end_ids == (eos, end_of_turn) == net.canvas.eos_ids
    assert TextModel(torch.nn.Linear(1, 1), tokenizer).end_ids == (eos,)
    sampler = api.kind_sampler("diffusion_gemma", max_steps=4)
    prompts = ["Question: 2 + 3 = ?\nAnswer:"]
    decoded: list[list[int]] = []  # the ids of each text `generate` decodes: the raw answer, then the scored one
    monkeypatch.setattr(model, "decode", lambda ids: decoded.append(list(ids)) or TextModel.decode(model, ids))
    net._spec = dataclasses.replace(net.canvas, eos_ids=(eos,))
    first = api.generate(model, prompts, sampler, GEN, progress=False)
    ids = decoded[0]
    assert len(ids) == GEN and eos not in ids  # random weights: a full answer that never ends
    end = next(i for i in range(1, GEN) if ids[i] not in ids[:i])  # a token first met past the start
    net._spec = dataclasses.replace(net.canvas, eos_ids=(eos, ids[end]))  # as if it were <end_of_turn>
    second = api.generate(model, prompts, sampler, GEN, progress=False)
    assert decoded[2][:end + 1] == ids[:end + 1] and decoded[3] == ids[:end]  # the same draws, cut at the end
    assert second.texts[0] == tokenizer.decode(ids[:end])
    # the sampler ended the row at the same id: no second canvas (4 steps each, max_steps=4)
    assert end < net.canvas.length and (int(first.nfe[0]), int(second.nfe[0])) == (8, 4)


def test_the_tiny_sweep_expands_to_revisable_samplers() -> None:
    """conf/sweep/diffusion_gemma_tiny.yaml (docs/results/diffusion_gemma_tiny_sweep.md): each job a valid
    RevisableSampler, EB's bound x steps x stops, then the stop's stability, then threshold and top-k."""
    import yaml
    from conftest import ROOT

    from mdmkit.evaluation.resolve import build_sampler
    from mdmkit.evaluation.sweep import expand
    from mdmkit.samplers import EBSampler, RevisableSampler, ThresholdSampler, TopKSampler

    jobs = expand(yaml.safe_load((ROOT / "conf" / "sweep" / "diffusion_gemma_tiny.yaml").read_text()))
    samplers = [build_sampler(job.sampler) for job in jobs]
    assert len(jobs) == 36 and {job.preset for job in jobs} == {"diffusion_gemma"}
    rules = [type(sampler.rule) for sampler in samplers if isinstance(sampler, RevisableSampler)]
    assert (rules.count(EBSampler), rules.count(ThresholdSampler), rules.count(TopKSampler)) == (20, 8, 8)


def with_generation_config(model_dir: Path, directory: Path, **settings: object) -> Path:
    """A copy of the tiny model whose generation_config.json sets `settings` (transformers' names)."""
    checkpoint = shutil.copytree(model_dir, directory)
    config = json.loads((checkpoint / "generation_config.json").read_text())
    (checkpoint / "generation_config.json").write_text(json.dumps({**config, **settings}))
    return checkpoint


def plan_for(checkpoint: Path, tmp_path: Path, *overrides: str, named: bool = False) -> EvaluationPlan:
    from mdmkit.evaluation.plan import plan_evaluation

    cfg = compose_config("evaluate", ["task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", f"ckpt={checkpoint}",
                                      "hf.kind=diffusion_gemma", "device=cpu", f"results_file={tmp_path / 'r.jsonl'}",
                                      "wandb.mode=disabled", *overrides])
    return plan_evaluation(cfg, preset="diffusion_gemma" if named else "topk", sampler_named=named)


def test_a_checkpoint_s_own_settings_make_the_default_sampler(model_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Its generation_config.json sets other steps, temperatures and entropy bound than transformers' defaults (the
    preset's): evaluate.py's plan and the lm-eval model naming no sampler both build the kind's default with them,
    saying so in one line, before any weights load; a field the user sets wins (a nested sampler swapped by name takes
    the bound with it); a sampler the user names runs as named, the line saying what the checkpoint sets."""
    from mdmkit.evaluation.lm_eval_model import checked_settings
    from mdmkit.evaluation.resolve import build_sampler
    from mdmkit.samplers import EBSampler, RevisableSampler, TopKSampler

    bound = {"entropy_bound": 0.7, "_cls_name": "EntropyBoundSamplerConfig"}
    checkpoint = with_generation_config(model_dir, tmp_path / "model", max_denoising_steps=5, t_min=0.2,
                                        sampler_config=bound)
    own = RevisableSampler(rule=EBSampler(gamma=0.7, ordering="entropy"), max_steps=5, t_min=0.2)
    line = (f"[mdmkit] sampler=diffusion_gemma (diffusion_gemma's default) with the settings {checkpoint} gives "
            "itself: max_steps=5, t_min=0.2, rule.gamma=0.7")
    plan = plan_for(checkpoint, tmp_path)
    assert build_sampler(plan.jobs[0].sampler) == own and plan.config["sampler"] == plan.jobs[0].sampler
    assert plan.jobs[0].preset == "diffusion_gemma" and capsys.readouterr().out == line + "\n"
    _, built, recorded, note = checked_settings(str(checkpoint), None, "diffusion_gemma", 2, GEN, 1, {})
    assert built == own and recorded["max_steps"] == 5 and note == line

    _, built, _, note = checked_settings(str(checkpoint), None, "diffusion_gemma", 2, GEN, 1,
                                         {"max_steps": 3, "rule": "topk"})
    assert (built.max_steps, built.t_min, type(built.rule)) == (3, 0.2, TopKSampler)
    assert note is not None and note.endswith("t_min=0.2; yours win over its max_steps=5, rule.gamma=0.7")
    plan = plan_for(checkpoint, tmp_path, "sampler=diffusion_gemma", "sampler.max_steps=3", named=True)
    assert build_sampler(plan.jobs[0].sampler) == RevisableSampler(max_steps=3)  # named: the preset, as given
    assert capsys.readouterr().out == (f"[mdmkit] sampler=diffusion_gemma as named: its preset's settings, not the "
                                       f"ones {checkpoint} gives itself (max_steps=5, t_min=0.2, rule.gamma=0.7), "
                                       "which it follows when no sampler is named\n")
    _, built, _, _ = checked_settings(str(checkpoint), "diffusion_gemma", "diffusion_gemma", 2, GEN, 1, {})
    assert built == RevisableSampler()


@pytest.mark.parametrize("settings, says", [
    ({"max_denoising_steps": 0}, "max_denoising_steps=0 must be an integer >= 1"),
    ({"stability_threshold": 1.5}, "stability_threshold=1.5 must be an integer >= 0"),
    ({"confidence_threshold": 1}, "confidence_threshold=1 must be a float > 0"),
    ({"sampler_config": {"entropy_bound": "high", "_cls_name": "EntropyBoundSamplerConfig"}},
     'entropy_bound="high" must be a float > 0'),
    ({"t_min": 0.5, "t_max": 0.5}, "t_max=0.5 must be > t_min=0.5"),
    ({"top_k": 3}, "DiffusionGemmaGenerationConfig refuses it: Unexpected kwargs"),
], ids=["steps", "stability", "confidence", "bound", "schedule", "unknown"])
def test_a_malformed_generation_config_is_one_line(settings: dict, says: str, tmp_path: Path) -> None:
    """A value transformers' loading would refuse stops the kind's default sampler at once, in one line naming the
    file (the weights are never read: this directory has none)."""
    from mdmkit.core.errors import CheckpointError
    from mdmkit.models.llm.registry import model_kind

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, **settings}))
    read = model_kind("diffusion_gemma").sampler_settings
    assert read is not None
    with pytest.raises(CheckpointError, match=re.escape(says)) as refused:
        read(str(tmp_path))
    assert str(refused.value).startswith(f"{tmp_path / 'generation_config.json'}: ") and "\n" not in str(refused.value)


def test_a_malformed_generation_config_stops_both_evaluations(tmp_path: Path) -> None:
    from mdmkit.core.errors import CheckpointError
    from mdmkit.evaluation.lm_eval_model import check_model_args

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "generation_config.json").write_text("{\"max_denoising_steps\": 4,")
    with pytest.raises(CheckpointError, match="generation_config.json does not read as JSON"):
        plan_for(tmp_path / "model", tmp_path)
    with pytest.raises(CheckpointError, match="generation_config.json does not read as JSON"):
        check_model_args(f"ckpt={tmp_path / 'model'},kind=diffusion_gemma,max_steps=3")


def test_a_hub_name_s_settings_are_read_as_transformers_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A hub name's generation_config.json comes from the hub cache (HF_HUB_OFFLINE honoured: no network here);
    one that cannot be had leaves the preset, in one line."""
    import huggingface_hub.constants

    from mdmkit.models.llm.registry import model_kind

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    repo, commit = tmp_path / "models--someone--diffusiongemma", "0" * 40
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "generation_config.json").write_text(json.dumps({"max_denoising_steps": 7}))
    read = model_kind("diffusion_gemma").sampler_settings
    assert read is not None and read("someone/diffusiongemma") == {"max_steps": 7}
    assert read("someone/elsewhere") == {}
    out = capsys.readouterr().out
    assert out.startswith("[mdmkit] someone/elsewhere: its generation_config.json cannot be read here (")
    assert out.endswith("): sampler=diffusion_gemma keeps its preset's settings (transformers' defaults)\n")
    assert out.count("\n") == 1


def evaluate_code(name: str, chat: bool, model: Path, directory: Path) -> list[dict]:
    """The generations `evaluate.py task=<name>` writes with the kind's sampler at CODE_STEPS steps a canvas."""
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    cfg = compose_config("evaluate", [
        f"task={name}", f"task.data_dir={BENCHMARK_DATA}", f"task.max_gen_len={GEN}", f"task.chat={chat}",
        f"ckpt={model}", "hf.kind=diffusion_gemma", f"hf.max_length={MAX_LENGTH}", f"limit={DOCS}",
        f"batch_size={DOCS}", "device=cpu", f"results_file={directory / 'rows.jsonl'}", "wandb.mode=disabled", "seed=0",
        "sampler=diffusion_gemma", f"sampler.max_steps={CODE_STEPS}"])
    threads = torch.get_num_threads()
    (row,) = run_evaluation(plan_evaluation(cfg))
    torch.set_num_threads(threads)
    assert row["n"] == DOCS and row["sampler"]["max_steps"] == CODE_STEPS
    return generations(directory, row)


@pytest.mark.parametrize("task, chat", [(HumanEvalTask, True), (MBPPTask, False)], ids=["humaneval_chat", "mbpp"])
def test_the_code_tasks_give_one_answer_cut_at_the_network_s_end_ids(task: type[CodeTask], chat: bool, model_dir: Path,
                                                                      code_model: TextModel, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """HumanEval in Gemma's chat template (`task.chat=true`; lm-eval's `--apply_chat_template`) and MBPP as text (its
    4 shots; both prompts' starts cut to the positions): evaluate.py and mdmkit-lm-eval give the same text, verdict
    (in the sandbox) and NFE, document by document, with the task's stop phrases and the checkpoint's end ids. There,
    the generation config names a third end id, one that the first answer draws in its first canvas (as if it were
    <end_of_turn>): both paths end that row with its first canvas and score the text before it."""
    from mdmkit import api
    from mdmkit.evaluation import generation
    from mdmkit.sandbox import ENV_VAR, ISOLATION_ENV
    from mdmkit.sandbox.isolation import available

    data = BENCHMARK_DATA / task.source.local_files["test"]
    if not data.is_file():
        pytest.skip(f"benchmark data not found: {data}")
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, available())  # bwrap, else the fallback (also on GPU nodes)
    # the answers evaluate.py draws with the checkpoint as it is (the same batch, seed and positions), their ids kept
    benchmark = task(data_dir=str(BENCHMARK_DATA), max_gen_len=GEN, limit=DOCS, chat=chat)
    drawn: list[list[int]] = []  # each row's settled answer ids, in row order
    settled = generation._settled
    with monkeypatch.context() as patch:
        patch.setattr(generation, "_settled", lambda *args: drawn.append(settled(*args)[0]) or settled(*args))
        first = api.generate(code_model, benchmark.prompts(), api.kind_sampler("diffusion_gemma", max_steps=CODE_STEPS),
                             GEN, benchmark.stop_phrases, batch_size=DOCS, seed=0, chat=chat, progress=False)
    ids = drawn[0]
    assert len(ids) == GEN and int(first.nfe[0]) == 2 * CODE_STEPS  # random weights: an answer that never ends
    end = next(i for i in range(1, code_model.network.canvas.length) if ids[i] not in ids[:i])  # first met past 0
    checkpoint = shutil.copytree(model_dir, tmp_path / "model")
    config = json.loads((checkpoint / "generation_config.json").read_text())
    config["eos_token_id"] = [*config["eos_token_id"], ids[end]]
    (checkpoint / "generation_config.json").write_text(json.dumps(config))

    ours = evaluate_code(benchmark.name, chat, checkpoint, tmp_path)
    template = {"apply_chat_template": True, "fewshot_as_multiturn": False} if chat else {}
    samples = lm_eval_samples(monkeypatch, f"ckpt={checkpoint},kind=diffusion_gemma,max_length={MAX_LENGTH},"
                              f"sampler=diffusion_gemma,max_steps={CODE_STEPS}", GEN, DOCS, DOCS, task=benchmark.name,
                              **template)
    prompts = [code_model.chat([{"role": "user", "content": text}]) if chat else text for text in benchmark.prompts()]
    assert [sample["arguments"][0][0] for sample in samples] == prompts  # in Gemma's template, or as text
    assert prompts[0].startswith("<bos><start_of_turn>user\n") == chat
    assert_one_answer(samples, ours)
    assert ours[0]["generation"] == code_model.decode(ids[:end]) and ours[0]["nfe"] == CODE_STEPS  # ended at the id
    assert not any(doc["correct"] for doc in ours)  # a random model passes no test

"""GSM8K / HumanEval / MBPP tasks, text stop conditions and prompted generation on tiny local models."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import BENCHMARK_DATA, compose_config

pytest.importorskip("transformers")

from tiny_text_models import byte_level_tokenizer

from mdmkit.core.config import build
from mdmkit.core.errors import CapabilityError, ConfigError, DataFormatError
from mdmkit.core.stopping import TextStop, find_stop
from mdmkit.evaluation.generation import TextModel, generate
from mdmkit.evaluation.text_eval import HFModelConfig, load_text_model
from mdmkit.samplers import EBSampler, NTPDecoder, SBDSampler, ThresholdSampler, TopKSampler
from mdmkit.sandbox import ENV_VAR, ISOLATION_ENV
from mdmkit.sandbox.isolation import available as available_isolation
from mdmkit.tasks.code import HumanEvalTask, MBPPTask
from mdmkit.tasks.gsm8k import GSM8KTask, worked_solution

needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "mbpp.jsonl").exists(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")
DATA = str(BENCHMARK_DATA)


# -- prompts ----------------------------------------------------------------------------------------
def test_worked_solution_drops_calculator_notes_and_ends_with_the_stop_phrase():
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips.\nThen 48+24 = <<48+24=72>>72.\n#### 72"
    assert worked_solution(gold) == "Natalia sold 48/2 = 24 clips. Then 48+24 = 72. The answer is 72."


@needs_data
def test_gsm8k_prompts_in_both_styles():
    eb = GSM8KTask(data_dir=DATA, limit=3)
    prompt = eb.prompts()[0]
    assert prompt.count("Question:") == 9 and prompt.count("The answer is") == 8  # 8 shots + the question
    assert prompt.startswith("Question: Natalia sold clips") and prompt.endswith("\nAnswer:")
    assert "<<" not in prompt and "####" not in prompt
    assert eb.stop_phrases == ["The answer is %d."]
    lm_eval = GSM8KTask(data_dir=DATA, style="lm_eval", shots=5, stop=["Question:"], limit=3)
    prompt = lm_eval.prompts()[0]
    assert prompt.count("Question:") == 6 and prompt.count("####") == 5
    assert len(eb.docs("test")) == 3 and len(GSM8KTask(data_dir=DATA).docs("test")) == 1319


@needs_data
def test_mbpp_splits_by_task_id_and_builds_begin_done_prompts():
    task = MBPPTask(data_dir=DATA)
    docs = task.docs("test")
    assert len(docs) == 500 and docs[0]["task_id"] == 11 and docs[-1]["task_id"] == 510
    prompt = task.prompts()[0]
    assert prompt.count("[BEGIN]") == 5 and prompt.count("[DONE]") == 4 and prompt.endswith("[BEGIN]\n")
    assert "\r" not in prompt
    three = MBPPTask(data_dir=DATA, shots=3, fewshot_ids=[2, 3, 4], limit=1)
    assert three.prompts()[0].count("[DONE]") == 3
    assert task.stop_phrases == ["[DONE]"]


@needs_data
def test_humaneval_prompt_is_the_signature_and_stops_follow_the_model_family():
    task = HumanEvalTask(data_dir=DATA, limit=2)
    assert task.prompts()[0] == task.docs("test")[0]["prompt"]
    assert task.stop_phrases == ["<|endoftext|>", "\n\n\n"]
    assert HumanEvalTask(data_dir=DATA, stop_family="dream").stop_phrases == ["<|endoftext|>", "```\n"]


@needs_data
def test_reference_answers_score_correct_and_junk_scores_wrong(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, available_isolation())  # bwrap, else the fallback (also on GPUs)
    gsm = GSM8KTask(data_dir=DATA, limit=2)
    docs = gsm.docs("test")
    gold = [worked_solution(d["answer"]) for d in docs]
    assert [v.correct for v in gsm.score(docs, gold)] == [True, True]
    assert [v.correct for v in gsm.score(docs, ["no idea", "The answer is 0."])] == [False, False]

    human = HumanEvalTask(data_dir=DATA, limit=2)
    docs = human.docs("test")
    verdicts = human.score(docs, [d["canonical_solution"] for d in docs])
    assert all(v.correct for v in verdicts), verdicts
    assert not human.score(docs[:1], ["    while True:\n        pass\n"])[0].correct

    mbpp = MBPPTask(data_dir=DATA, limit=2, sandbox_timeout_s=5.0)
    docs = mbpp.docs("test")
    assert all(v.correct for v in mbpp.score(docs, [d["code"] + "\n[DONE]" for d in docs]))
    wrong = mbpp.score(docs[:1], ["def f():\n    return 1\n"])[0]
    assert not wrong.correct and wrong.detail


def test_bad_task_configs_fail_with_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="shots"):
        GSM8KTask(shots=-1)
    with pytest.raises(ConfigError, match="stop_family"):
        GSM8KTask(stop_family="gpt")
    with pytest.raises(ConfigError, match="data_dir"):
        GSM8KTask(data_dir=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="0-shot"):
        HumanEvalTask(shots=2)
    with pytest.raises(ConfigError, match="fewshot_ids"):
        MBPPTask(fewshot_ids=[20])
    with pytest.raises(DataFormatError, match="gsm8k_test.jsonl"):
        GSM8KTask(data_dir=str(tmp_path)).docs("test")  # a directory without the benchmark files


@needs_data
def test_task_configs_compose_with_local_data(monkeypatch):
    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", DATA)
    for name, kind in (("gsm8k", GSM8KTask), ("gsm8k_lm_eval", GSM8KTask), ("humaneval", HumanEvalTask),
                       ("mbpp", MBPPTask), ("mbpp_lm_eval", MBPPTask)):
        cfg = compose_config("evaluate", [f"task={name}"])
        task = build(cfg.task, "task")
        assert isinstance(task, kind) and task.data_dir == DATA
    assert build(compose_config("evaluate", ["task=mbpp_lm_eval"]).task, "task").shots == 3


# -- stopping and generation ------------------------------------------------------------------------
class ScriptedMaskedLM(torch.nn.Module):
    """Predicts a fixed answer with certainty: every position's logits are one-hot on its scripted token."""

    def __init__(self, answer: list[int], prompt_length: int, vocab: int, mask_id: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.answer, self.prompt_length, self.vocab, self.mask_id = answer, prompt_length, vocab, mask_id

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, self.vocab)
        for i, token in enumerate(self.answer):
            logits[:, self.prompt_length + i, token] = 30.0
        return logits


def test_text_stop_needs_the_phrase_settled_and_everything_before_it():
    tokenizer = byte_level_tokenizer()
    ids = tokenizer("so The answer is 42. junk", add_special_tokens=False)["input_ids"]
    stop = TextStop(("The answer is %d.",), tokenizer.decode)
    mask = tokenizer.mask_token_id
    tokens = torch.tensor([ids, ids, [mask] + ids[1:]])
    cut = len(ids) - len(tokenizer(" junk", add_special_tokens=False)["input_ids"])
    tokens[1, cut - 1] = mask  # the "." still masked: the number could still grow
    answer = torch.ones_like(tokens, dtype=torch.bool)
    assert stop.met(tokens, answer, mask).tolist() == [True, False, False]
    with pytest.raises(ValueError):
        TextStop((), tokenizer.decode)


@pytest.mark.parametrize("stop_early", [True, False])
def test_generation_stops_at_the_phrase_and_counts_forwards_to_it(stop_early):
    tokenizer = byte_level_tokenizer()
    prompt = "Question: 6 times 7?\nAnswer:"
    prompt_ids = tokenizer(prompt)["input_ids"]
    answer = tokenizer(" The answer is 42. Question: junk junk", add_special_tokens=False)["input_ids"]
    upto = len(tokenizer(" The answer is 42.", add_special_tokens=False)["input_ids"])
    network = ScriptedMaskedLM(answer, len(prompt_ids), len(tokenizer), tokenizer.mask_token_id)
    model = TextModel(network, tokenizer)
    sampler = TopKSampler(k=1, stop_early=stop_early)  # equal confidences: left to right, one token per pass
    made = generate(model, [prompt], sampler, len(answer), ["The answer is %d."], progress=False)
    assert made.texts == [" The answer is 42."]
    assert made.nfe_to_stop.tolist() == [upto]
    assert made.nfe.tolist() == [upto if stop_early else len(answer)]


def test_batched_generation_equals_one_prompt_at_a_time(masked_dir):
    model = load_text_model(str(masked_dir), HFModelConfig(), "cpu")
    prompts = ["def add(a, b):\n", "Question: a much longer prompt with many more tokens in it?\nAnswer:", "x"]
    for sampler in (TopKSampler(k=2), EBSampler(gamma=0.5), ThresholdSampler(tau=0.3, block_length=4)):
        batched = generate(model, prompts, sampler, 8, ["\n\n\n"], batch_size=3, progress=False)
        alone = [generate(model, [p], sampler, 8, ["\n\n\n"], batch_size=1, progress=False) for p in prompts]
        assert batched.raw == [a.raw[0] for a in alone]
        assert batched.nfe.tolist() == [int(a.nfe[0]) for a in alone]


def test_prompts_longer_than_max_length_lose_their_start(masked_dir):
    model = load_text_model(str(masked_dir), HFModelConfig(max_length=12), "cpu")
    ids, cut = model.encode_prompt("one two three four five six seven eight nine ten eleven", False, 4)
    assert len(ids) == 8 and cut
    assert model.decode(ids).endswith("eleven")
    with pytest.raises(ConfigError, match="no room"):
        model.encode_prompt("x", False, 12)


def test_without_max_length_prompts_are_cut_to_the_models_positions(masked_dir):
    model = load_text_model(str(masked_dir), HFModelConfig(), "cpu")
    positions = model.network.model.config.max_position_embeddings
    assert model.max_length == positions
    assert len(model.encode_prompt("one two " * positions, False, 4)[0]) == positions - 4


def test_causal_baseline_decodes_greedily_with_one_forward_per_token(causal_dir):
    model = load_text_model(str(causal_dir), HFModelConfig(kind="causal"), "cpu")
    made = generate(model, ["def add(a, b):\n", "x"], NTPDecoder(), 6, ["\n\n\n"], batch_size=2, progress=False)
    assert made.nfe.max() <= 6 and (made.nfe >= 1).all()
    assert (made.nfe == made.nfe_to_stop).all()


CAUSAL_PROMPTS = ["def add(a, b):\n", "Question: a much longer prompt with many more tokens in it?\nAnswer:", "x"]


@torch.no_grad()
def greedy_reference(model, prompt: str, gen_length: int, stops: list[str]) -> list[int]:
    """A plain greedy loop without a cache: the whole sequence every step, until EOS or a stop phrase."""
    ids, made = model.encode_prompt(prompt, False, gen_length)[0], []
    for _ in range(gen_length):
        made.append(int(model.network(torch.tensor([ids + made]))[0, -1].argmax()))
        if made[-1] == model.tokenizer.eos_token_id or find_stop(model.decode(made), stops) is not None:
            break
    return made


def test_a_causal_lm_generates_through_ntp_and_the_counter_like_a_plain_greedy_loop(causal_dir):
    model = load_text_model(str(causal_dir), HFModelConfig(kind="causal"), "cpu")
    free = [greedy_reference(model, p, 8, []) for p in CAUSAL_PROMPTS]
    # the tiny model's end-of-text token: one it generates third in row 0; a stop phrase: row 1's first tokens
    model.tokenizer.eos_token = model.tokenizer.convert_ids_to_tokens(free[0][2])
    for stops in ([], [model.decode(free[1][:4])]):
        expected = [greedy_reference(model, p, 8, stops) for p in CAUSAL_PROMPTS]
        assert len(expected[0]) <= 3 and any(len(e) == 8 for e in expected)
        assert len(expected[1]) == (4 if stops else 8)
        batched = generate(model, CAUSAL_PROMPTS, NTPDecoder(), 8, stops, batch_size=3, progress=False)
        assert batched.raw == [model.decode(e) for e in expected]
        assert batched.nfe.tolist() == batched.nfe_to_stop.tolist() == [len(e) for e in expected]
        for i, prompt in enumerate(CAUSAL_PROMPTS):
            alone = generate(model, [prompt], NTPDecoder(), 8, stops, batch_size=1, progress=False)
            assert alone.raw == [batched.raw[i]] and alone.nfe.tolist() == [batched.nfe[i]]


def test_a_sampler_of_the_wrong_kind_fails_in_one_line(causal_dir, masked_dir):
    causal = load_text_model(str(causal_dir), HFModelConfig(kind="causal"), "cpu")
    masked = load_text_model(str(masked_dir), HFModelConfig(), "cpu")
    for model, sampler, hint in ((causal, TopKSampler(k=1), "sampler=ntp"), (causal, None, "sampler=ntp"),
                                 (masked, NTPDecoder(), "masked sampler"), (masked, SBDSampler(), "masked sampler")):
        with pytest.raises(CapabilityError, match=hint) as error:
            generate(model, ["x"], sampler, 4, [], progress=False)
        assert "\n" not in str(error.value)
    causal.tokenizer.mask_token = None  # SBD feeds masks: a causal LM without a mask token cannot take it
    with pytest.raises(ConfigError, match="no mask token"):
        generate(causal, ["x"], SBDSampler(block_size=4), 4, [], progress=False)


def test_sbd_runs_on_a_causal_lm_whose_tokenizer_has_a_mask_token(causal_dir):
    model = load_text_model(str(causal_dir), HFModelConfig(kind="causal"), "cpu")
    sampler = SBDSampler(block_size=4)  # blocks of 4 and 2 masks: 2 to 6 forwards
    made = generate(model, CAUSAL_PROMPTS, sampler, 6, [], batch_size=3, progress=False)
    assert len(made.raw) == 3 and (made.nfe >= 2).all() and (made.nfe <= 6).all()
    alone = [generate(model, [p], sampler, 6, [], batch_size=1, progress=False) for p in CAUSAL_PROMPTS]
    assert made.raw == [a.raw[0] for a in alone]
    assert made.nfe.tolist() == [int(a.nfe[0]) for a in alone]


# -- evaluate.py ------------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("task", ["gsm8k", "humaneval", "mbpp"])
def test_evaluate_runs_text_tasks_end_to_end_with_a_tiny_model(task, masked_dir, tmp_path, monkeypatch):
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, available_isolation())  # bwrap, else the fallback (also on GPUs)
    shots = {"gsm8k": ["task.shots=1"], "humaneval": [], "mbpp": ["task.shots=1"]}[task]
    cfg = compose_config("evaluate", [
        f"task={task}", f"task.data_dir={DATA}", "task.max_gen_len=8", *shots, f"ckpt={masked_dir}",
        "limit=2", "batch_size=2", "sampler=eb", "device=cpu", f"results_file={tmp_path}/rows.jsonl",
        "wandb.mode=disabled"])
    rows = run_evaluation(plan_evaluation(cfg), tmp_path)
    assert len(rows) == 1 and rows[0]["task"] == task and rows[0]["n"] == 2
    assert rows[0]["family"].startswith("eb") and rows[0]["nfe_mean"] >= 1
    lines = [json.loads(x) for x in (tmp_path / "generations" / f"{task}-{rows[0]['key']}.jsonl").read_text()
             .splitlines()]
    assert len(lines) == 2 and {"generation", "correct", "nfe"} <= set(lines[0])
    again = run_evaluation(plan_evaluation(cfg), tmp_path)  # resumed from the results file, not re-run
    assert again[0]["key"] == rows[0]["key"] and again[0]["time"] == rows[0]["time"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 1


@needs_data
def test_evaluate_causal_baseline_on_gsm8k(causal_dir, tmp_path):
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    cfg = compose_config("evaluate", [
        "task=gsm8k", f"task.data_dir={DATA}", "task.max_gen_len=6", "task.shots=1", f"ckpt={causal_dir}",
        "hf.kind=causal", "sampler=ntp", "limit=2", "device=cpu", f"results_file={tmp_path}/rows.jsonl",
        "wandb.mode=disabled"])
    rows = run_evaluation(plan_evaluation(cfg), tmp_path)
    assert rows[0]["weights"] == "causal" and rows[0]["nfe"]["max"] <= 6
    cfg = compose_config("evaluate", [  # a second knob for the same cut: rows recorded limit null
        "task=gsm8k", f"task.data_dir={DATA}", "+task.limit=2", f"ckpt={causal_dir}", "hf.kind=causal",
        "sampler=ntp", "device=cpu", f"results_file={tmp_path}/rows.jsonl", "wandb.mode=disabled"])
    with pytest.raises(ConfigError, match="task.limit=2: give limit=2"):
        run_evaluation(plan_evaluation(cfg), tmp_path)


def test_evaluate_refuses_a_masked_sampler_for_a_causal_lm_before_loading_it(tmp_path):
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    missing = tmp_path / "not-loaded"  # the sampler is refused before the weights are looked for
    data = tmp_path / "data"  # nor is any data read
    data.mkdir()
    for sampler in ([], ["sampler=eb"]):  # evaluate.yaml's default sampler is a masked one
        cfg = compose_config("evaluate", [
            "task=gsm8k", f"task.data_dir={data}", f"ckpt={missing}", "hf.kind=causal", *sampler, "device=cpu",
            f"results_file={tmp_path}/rows.jsonl", "wandb.mode=disabled"])
        with pytest.raises(CapabilityError, match="pass sampler=ntp") as error:
            run_evaluation(plan_evaluation(cfg), tmp_path)
        assert "\n" not in str(error.value)
    cfg = compose_config("evaluate", ["task=gsm8k", f"task.data_dir={data}", f"ckpt={missing}", "sampler=ntp",
                                      "device=cpu", f"results_file={tmp_path}/rows.jsonl", "wandb.mode=disabled"])
    with pytest.raises(CapabilityError, match="masked sampler"):
        run_evaluation(plan_evaluation(cfg), tmp_path)


def test_code_tasks_refuse_the_sandbox_before_loading_data_or_model(tmp_path, monkeypatch):
    """Scoring HumanEval / MBPP runs generated code: without the opt-in, or without the isolation asked for, the
    run stops before the (missing) model or data are even looked at, not after hours of generation."""
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation
    from mdmkit.sandbox import UnsafeExecutionError, isolation

    def config(task: str):
        return compose_config("evaluate", [f"task={task}", f"task.data_dir={tmp_path}", f"ckpt={tmp_path}/none",
                                           "device=cpu", f"results_file={tmp_path}/rows.jsonl", "wandb.mode=disabled"])

    monkeypatch.delenv(ENV_VAR, raising=False)
    for task in ("humaneval", "mbpp"):
        with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
            run_evaluation(plan_evaluation(config(task)), tmp_path)
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, "bwrap")
    monkeypatch.setattr(isolation, "bwrap_status", lambda: (False, "bwrap is not installed"))
    with pytest.raises(UnsafeExecutionError, match="isolation=bwrap, but bwrap is not installed"):
        run_evaluation(plan_evaluation(config("humaneval")), tmp_path)
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize("content, message", [
    ('{"question": "1+1?", "answer": "#### 2"}\n{"question": "x", "answer": \n', "cannot load the test split"),
    ('{"question": "1+1?", "answer": "#### 2"}\n{"q": "x", "a": "#### 1"}\n', "document 2 of the test split has no"),
])
def test_a_malformed_benchmark_file_stops_in_one_line_before_the_model_loads(tmp_path, content, message):
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    (tmp_path / "gsm8k_test.jsonl").write_text(content)
    cfg = compose_config("evaluate", ["task=gsm8k", "task.shots=0", f"task.data_dir={tmp_path}",
                                      f"ckpt={tmp_path}/none", "device=cpu", f"results_file={tmp_path}/rows.jsonl",
                                      "wandb.mode=disabled"])
    with pytest.raises(DataFormatError, match=message) as error:
        run_evaluation(plan_evaluation(cfg), tmp_path)
    assert "gsm8k_test.jsonl" in str(error.value) and "\n" not in str(error.value)


def test_a_chat_template_that_writes_its_bos_gets_no_second_one_from_the_tokenizer():
    """Gemma's tokenizer adds <bos> and its template writes one too: the chat prompt starts with exactly one (as
    transformers' own apply_chat_template(tokenize=True) makes it), from evaluate.py's task.chat and from lm-eval's
    templated text alike; a plain prompt keeps the one the tokenizer adds."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from mdmkit.evaluation.generation import TextModel

    vocab = {token: i for i, token in enumerate(["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
                                                 "user", "model", "hi", "\n"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[a-z_]+>|\n| "), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    template = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>"
                "\n{% endfor %}<start_of_turn>model\n")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", chat_template=template)
    model = TextModel(torch.nn.Identity(), tokenizer)
    chat, _ = model.encode_prompt("hi", True, 4)
    assert chat[:2] == [1, 3] and chat.count(1) == 1, chat
    templated = model.chat([{"role": "user", "content": "hi"}])  # what lm-eval's --apply_chat_template passes
    assert model.encode_prompt(templated, False, 4)[0] == chat
    assert model.encode_prompt("hi", False, 4)[0] == [1, 7]

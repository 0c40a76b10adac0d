"""The `mdmkit` lm-eval model: offline runs on local task YAMLs, sampler selection, NFE, the ELBO estimate."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import BENCHMARK_DATA, WAIT_S

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

import lm_eval
from lm_eval.tasks import TaskManager

from mdmkit.core.errors import CapabilityError, ConfigError
from mdmkit.evaluation.lm_eval_model import MdmkitLM, masked_elbo
from mdmkit.evaluation.lm_eval_nfe import Generation, attach_nfe, padding

needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").exists(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")

GSM8K_YAML = """\
task: gsm8k_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gsm8k_test.jsonl
    train: {data}/gsm8k_train.jsonl
test_split: test
fewshot_split: train
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
num_fewshot: 1
generation_kwargs:
  until: ["Question:"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tasks")
    (directory / "gsm8k_local.yaml").write_text(GSM8K_YAML.format(data=BENCHMARK_DATA.resolve()))
    return directory


@needs_data
def test_simple_evaluate_runs_offline_with_a_selected_sampler(masked_dir, task_dir, tmp_path):
    nfe_file = tmp_path / "nfe.jsonl"
    results = lm_eval.simple_evaluate(
        model="mdmkit", model_args=f"ckpt={masked_dir},sampler=threshold,tau=0.5,nfe_file={nfe_file}",
        tasks=["gsm8k_local"], limit=3, batch_size=2, device="cpu",
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
    )
    assert "exact_match,strict-match" in results["results"]["gsm8k_local"]
    rows = [json.loads(line) for line in nfe_file.read_text().splitlines()]
    assert len(rows) == 3
    assert all(1 <= r["nfe_to_stop"] <= r["nfe"] <= 8 for r in rows)
    assert rows[0]["sampler"]["_target_"].endswith("ThresholdSampler") and rows[0]["sampler"]["tau"] == 0.5
    assert sorted((r["task"], r["doc_id"]) for r in rows) == [("gsm8k_local", i) for i in range(3)]
    # any task: each answer carries its NFE into the logged samples, and a summary goes into the results JSON
    attach_nfe(results)
    by_doc = {r["doc_id"]: r for r in rows}
    for sample in results["samples"]["gsm8k_local"]:
        assert sample["mdmkit_nfe"] == [by_doc[sample["doc_id"]]["nfe"]]
        assert sample["mdmkit_nfe_to_stop"] == [by_doc[sample["doc_id"]]["nfe_to_stop"]]
    summary = results["config"]["mdmkit"]["nfe"]["gsm8k_local"]
    assert summary == {"generations": 3, "nfe_mean": pytest.approx(sum(r["nfe"] for r in rows) / 3),
                       "nfe_to_stop_mean": pytest.approx(sum(r["nfe_to_stop"] for r in rows) / 3)}
    assert results["config"]["mdmkit"]["sampler"]["tau"] == 0.5


@needs_data
def test_the_console_script_is_lm_evals_cli_with_mdmkit_registered(masked_dir, task_dir, tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", "from mdmkit.cli import lm_eval; lm_eval()", "--model", "mdmkit",
               "--model_args", f"ckpt={masked_dir},sampler=eb,gamma=0.1", "--include_path", str(task_dir),
               "--tasks", "gsm8k_local", "--limit", "2", "--batch_size", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gsm8k_local" in done.stdout and "[mdmkit] 2 generations: NFE mean" in done.stdout
    # the table shows the shots the task used (1 here)
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("|gsm8k_local")]
    assert row.split("|")[4].strip() == "1"


def test_a_bad_model_args_value_ends_the_console_script_with_one_line(masked_dir, monkeypatch, capsys):
    """The console script's function (the process itself: the test above), each bad value one line, status 2."""
    from mdmkit.cli import lm_eval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = {"sampler=nope": "error: sampler=nope: no such option (known: ",
             "gamma=-1": "error: sampler: gamma=-1 must be >= 0",
             "gammma=0.1": "error: sampler: unknown key 'gammma'",
             "ckpt=/nowhere/model": "error: no model directory at /nowhere/model"}
    for args, message in cases.items():
        monkeypatch.setattr(sys, "argv", ["mdmkit-lm-eval", "--model", "mdmkit", "--model_args",
                                          f"ckpt={masked_dir},{args}", "--tasks", "mdmkit_gsm8k", "--limit", "1"])
        with pytest.raises(SystemExit) as ended:
            lm_eval()
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "Traceback" not in err, err[-2000:]
        # beside lm-eval's own log lines, one line: the error
        lines = [line for line in err.splitlines() if not re.match(r"\d{4}-\d\d-\d\d:[\d:]+ (INFO|WARNING) ", line)]
        assert len(lines) == 1 and lines[0].startswith(message), err[-2000:]


def _request(*args):
    return SimpleNamespace(args=args)


def test_generate_until_stops_rows_at_until_during_sampling(masked_dir):
    lm = MdmkitLM(ckpt=str(masked_dir), sampler="topk", k=1, device="cpu", batch_size=2)
    # "a" is a likely token for nothing in particular, so use every single character: some will appear early
    until = list("abcdefghijklmnopqrstuvwxyz0123456789 ")
    out = lm.generate_until([_request("def f(x):", {"until": until, "max_gen_toks": 12}),
                             _request("Question:", {"until": until, "max_gen_toks": 12})], disable_tqdm=True)
    assert all(not any(u in text for u in until) for text in out)
    assert any(r["nfe_to_stop"] < 12 for r in lm.nfe_records)  # at least one row stopped before the end


def test_lm_evals_padding_copies_are_answered_once_and_not_counted(masked_dir):
    lm = MdmkitLM(ckpt=str(masked_dir), sampler="topk", k=2, device="cpu", batch_size=2)
    first = SimpleNamespace(args=("def f(x):", {"until": ["\n\n\n"], "max_gen_toks": 4}), repeats=1,
                            task_name="t", doc_id=0)
    last = SimpleNamespace(args=("Question:", {"until": ["\n\n\n"], "max_gen_toks": 4}), repeats=1,
                           task_name="t", doc_id=1)
    out = lm.generate_until([first, last, last, last], disable_tqdm=True)  # two padding copies of the last
    alone = MdmkitLM(ckpt=str(masked_dir), sampler="topk", k=2, device="cpu", batch_size=2).generate_until(
        [first, last], disable_tqdm=True)
    assert out == [alone[0], alone[1], alone[1], alone[1]]
    assert all(isinstance(text, Generation) and text.nfe == 2 for text in out)
    assert [(r["task"], r["doc_id"]) for r in lm.nfe_records] == [("t", 0), ("t", 1)]
    assert padding([first, first, last]) == [False, True, False]
    twice = SimpleNamespace(args=first.args, repeats=2)  # a task's `repeats` copies are real requests
    assert padding([twice, twice, twice]) == [False, False, True]


def test_a_generation_is_its_text_and_keeps_its_nfe_through_pickling():
    made = Generation("The answer is 4.", 7, 5)
    assert made == "The answer is 4." and made.strip() == "The answer is 4."
    assert json.dumps(made) == '"The answer is 4."'
    again = pickle.loads(pickle.dumps(made))  # rank gathers and lm-eval's response cache pickle answers
    assert (again, again.nfe, again.nfe_to_stop, type(again)) == (made, 7, 5, Generation)
    assert type(made)("gold").nfe is None  # lm-eval builds answer-typed strings from other text
    from mdmkit.lm_eval_tasks.utils import gsm8k_score

    doc = {"question": "2+2?", "answer": "2+2=4\n#### 4"}
    assert gsm8k_score(doc, [made]) == {"accuracy": 1.0, "nfe": 7.0, "nfe_to_stop": 5.0}
    assert gsm8k_score(doc, ["The answer is 5."]) == {"accuracy": 0.0}  # another model's answer: no NFE


def test_bad_model_args_fail_with_one_clear_error(masked_dir):
    with pytest.raises(ConfigError, match="sampler=nope: no such option"):
        MdmkitLM(ckpt=str(masked_dir), sampler="nope")
    with pytest.raises(ConfigError, match="gamma"):
        MdmkitLM(ckpt=str(masked_dir), sampler="eb", gamma=-1.0)
    with pytest.raises(ConfigError, match="unknown key"):
        MdmkitLM(ckpt=str(masked_dir), sampler="eb", gammma=0.1)
    with pytest.raises(ConfigError, match="ckpt"):
        MdmkitLM()
    if not torch.cuda.is_available():  # was: a note, then hours on the CPU
        with pytest.raises(ConfigError, match="device=cuda, but"):
            MdmkitLM(ckpt=str(masked_dir), device="cuda")
    lm = MdmkitLM(ckpt=str(masked_dir), device="cpu")
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([_request("text")])


def test_kind_causal_decodes_with_ntp_through_the_counter(causal_dir):
    lm = MdmkitLM(ckpt=str(causal_dir), kind="causal", device="cpu", batch_size=2)  # sampler: ntp by default
    assert lm.sampler_config["_target_"].endswith("NTPDecoder")
    out = lm.generate_until([_request("def f(x):", {"until": ["\n\n\n"], "max_gen_toks": 6}),
                             _request("Question:", {"until": ["\n\n\n"], "max_gen_toks": 6})], disable_tqdm=True)
    assert len(out) == 2
    assert all(1 <= r["nfe_to_stop"] <= r["nfe"] <= 6 for r in lm.nfe_records)
    sampled = MdmkitLM(ckpt=str(causal_dir), kind="causal", sampler="ntp", temperature=0.5, device="cpu")
    assert sampled.sampler.temperature == 0.5


def test_a_sampler_of_the_wrong_kind_is_refused_in_one_line(masked_dir, causal_dir):
    for args, hint in (({"ckpt": str(causal_dir), "kind": "causal", "sampler": "eb"}, "sampler=ntp"),
                       ({"ckpt": str(masked_dir), "sampler": "ntp"}, "masked sampler")):
        with pytest.raises(CapabilityError, match=hint) as error:
            MdmkitLM(device="cpu", **args)
        assert "\n" not in str(error.value)


@torch.no_grad()
def _exact_elbo(network, mask_id, context, continuation):
    """E_l E_mask[(C/l) sum_masked log p] by enumerating every count l and every masked subset."""
    total = len(continuation)
    sequence = torch.tensor(context + continuation)
    value = 0.0
    for count in range(1, total + 1):
        subsets = list(itertools.combinations(range(total), count))
        for subset in subsets:
            masked = sequence.clone()
            for j in subset:
                masked[len(context) + j] = mask_id
            logp = torch.log_softmax(network(masked[None])[0].float(), -1)
            score = sum(float(logp[len(context) + j, continuation[j]]) for j in subset)
            value += (total / count) * score / len(subsets) / total
    return value


def test_masked_elbo_matches_its_enumerated_expectation(masked_dir):
    lm = MdmkitLM(ckpt=str(masked_dir), device="cpu")
    network, mask_id = lm.model.network, lm.model.network.mask_id
    context, continuation = [40, 41, 42], [50, 51, 52]
    exact = _exact_elbo(network, mask_id, context, continuation)
    generator = torch.Generator().manual_seed(0)
    estimate = masked_elbo(network, mask_id, context, continuation, 1000, generator)
    # measured per-sample std on this model: 0.23 nats, so 3 sigma of a 1000-sample mean is 0.022
    assert abs(estimate - exact) < 0.03, (estimate, exact)
    one = masked_elbo(network, mask_id, context, continuation[:1], 3, generator)
    assert one == pytest.approx(_exact_elbo(network, mask_id, context, continuation[:1]), abs=1e-5)
    assert one <= 0


def test_loglikelihood_returns_one_pair_per_request(masked_dir):
    lm = MdmkitLM(ckpt=str(masked_dir), device="cpu", mc_samples=8)
    out = lm.loglikelihood([_request("Question: 2+2?\nAnswer:", " 4"), _request("def f", "(x):")],
                           disable_tqdm=True)
    assert len(out) == 2 and all(score < 0 and greedy is False for score, greedy in out)
    # each request draws from its own stream: the same estimate alone, so whichever rank (or order) runs it
    assert lm.loglikelihood([_request("def f", "(x):")], disable_tqdm=True) == [out[1]]


@needs_data
def test_the_three_benchmarks_run_through_lm_eval_with_mdmkits_task_configs(masked_dir, monkeypatch):
    from mdmkit.lm_eval_tasks import utils
    from mdmkit.sandbox import ENV_VAR, ISOLATION_ENV
    from mdmkit.sandbox.isolation import available

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, available())  # bwrap, else the fallback (also on GPU nodes)
    utils.task.cache_clear()
    tasks = Path(utils.__file__).parent
    results = lm_eval.simple_evaluate(
        model="mdmkit", model_args=f"ckpt={masked_dir},sampler=eb,gamma=0.1", gen_kwargs="max_gen_toks=6",
        tasks=["mdmkit_gsm8k", "mdmkit_humaneval", "mdmkit_mbpp"], limit=2, batch_size=2, device="cpu",
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
    )
    for name in ("gsm8k", "humaneval", "mbpp"):
        metrics = results["results"][f"mdmkit_{name}"]
        assert metrics["accuracy,none"] == 0.0  # a random model solves nothing
        samples = results["samples"][f"mdmkit_{name}"]
        assert metrics["nfe,none"] == pytest.approx(sum(s["nfe"] for s in samples) / 2)  # beside accuracy
        assert metrics["nfe_to_stop,none"] == pytest.approx(sum(s["nfe_to_stop"] for s in samples) / 2)
        assert all(1 <= s["nfe_to_stop"] <= s["nfe"] <= 6 for s in samples)
        # lm-eval's own few-shot rebuilds the same prompt as evaluate.py task=<name>, and reports its shots
        prompt = samples[0]["arguments"][0][0]  # (context, gen_kwargs) of request 0
        assert prompt == utils.task(name).prompts()[0]
    assert results["n-shot"] == {"mdmkit_gsm8k": 8, "mdmkit_humaneval": 0, "mdmkit_mbpp": 4}


@needs_data
def test_predict_only_loads_the_code_tasks_without_the_sandboxs_opt_in(monkeypatch):
    """Nothing is scored then (lm-eval bypasses the metrics), so nothing runs: the opt-in is not asked for."""
    from mdmkit.evaluation.lm_eval_nfe import with_nfe
    from mdmkit.lm_eval_tasks import utils
    from mdmkit.sandbox import ENV_VAR, UnsafeExecutionError

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    monkeypatch.delenv(ENV_VAR, raising=False)
    utils.task.cache_clear()
    manager = TaskManager(include_path=str(Path(utils.__file__).parent), include_defaults=False)
    load = with_nfe(lambda **kwargs: {"tasks": manager.load(["mdmkit_humaneval"])["tasks"]})
    assert "mdmkit_humaneval" in load(predict_only=True)["tasks"]
    with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
        load(predict_only=False)


@pytest.mark.parametrize("name", ["gsm8k", "humaneval", "mbpp"])
def test_mdmkits_task_configs_state_the_tasks_own_defaults(name: str) -> None:
    """lm-eval reads the YAML, evaluate.py the task: the stops, answer length and shots must be the same."""
    import yaml

    from mdmkit.lm_eval_tasks import utils

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    config = yaml.load((Path(utils.__file__).parent / f"mdmkit_{name}.yaml").read_text(), Loader=Loader)
    task = utils.task(name)
    assert config["generation_kwargs"]["until"] == task.stop_phrases
    assert config["generation_kwargs"]["max_gen_toks"] == task.max_gen_len
    assert config["num_fewshot"] == task.shots


@needs_data
@pytest.mark.parametrize("name, shots", [("gsm8k", 2), ("mbpp", 3)])
def test_num_fewshot_changes_the_shots_of_mdmkits_tasks(name, shots, monkeypatch):
    from mdmkit.lm_eval_tasks import utils
    from mdmkit.sandbox import ENV_VAR, ISOLATION_ENV, UnsafeExecutionError
    from mdmkit.sandbox.isolation import available as available_isolation
    from mdmkit.tasks.code import MBPPTask
    from mdmkit.tasks.gsm8k import GSM8KTask

    monkeypatch.setenv("MDMKIT_BENCHMARK_DATA", str(BENCHMARK_DATA))
    utils.task.cache_clear()
    manager = TaskManager(include_path=str(Path(utils.__file__).parent), include_defaults=False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    if name == "mbpp":  # its scores run generated code: refused when lm-eval loads the task, before generating
        with pytest.raises(UnsafeExecutionError, match=ENV_VAR):
            manager.load([f"mdmkit_{name}"])
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setenv(ISOLATION_ENV, available_isolation())
    task = manager.load([f"mdmkit_{name}"])["tasks"][f"mdmkit_{name}"]
    mdm_task = {"gsm8k": GSM8KTask, "mbpp": MBPPTask}[name](data_dir=str(BENCHMARK_DATA), shots=shots)
    doc = task.test_docs()[0]
    assert task.fewshot_context(doc, num_fewshot=shots) == mdm_task.prompts()[0]  # lm-eval's 3-shot MBPP too

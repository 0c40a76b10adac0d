"""`mdmkit-lm-eval` data parallel through lm-eval's own mechanism (issue 17): two CPU processes under torchrun
(gloo), each a model replica that lm-eval gives every second document, give the single-process results:
metrics, every logged sample with its NFE, the NFE summary and the per-request NFE file. Five documents per
task do not split evenly, so lm-eval pads the second rank with a copy of its last request, which must be
neither generated again nor counted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BENCHMARK_DATA, WAIT_S

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from mdmkit.lm_eval_tasks import utils

needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").exists(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")

# rows stop at the first settled one of these, so the NFE differs from document to document
STOP_TASK = """\
task: stop_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gsm8k_test.jsonl
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["e", "a", "4", "t"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def command(*args: str, processes: int) -> list[str]:
    script = Path(sys.executable).with_name("mdmkit-lm-eval")  # the console script, as a user runs it
    cli = [str(script)] if script.is_file() else [sys.executable, "-c", "from mdmkit.cli import lm_eval; lm_eval()"]
    if processes == 1:
        return [*cli, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            "--no-python", *cli, *args]


def start(tmp_path: Path, masked_dir: Path, tasks: Path, processes: int) -> subprocess.Popen:
    """One run, started (the two runs overlap: most of each is importing lm-eval); its NFE file is in `out`."""
    out = tmp_path / f"out{processes}"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MDMKIT_BENCHMARK_DATA": str(BENCHMARK_DATA), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command(
        "--model", "mdmkit", "--model_args", f"ckpt={masked_dir},sampler=topk,k=1,nfe_file={out}/nfe.jsonl",
        "--include_path", str(tasks), "--tasks", "stop_local,mdmkit_gsm8k", "--gen_kwargs", "max_gen_toks=12",
        "--limit", "5", "--batch_size", "1", "--device", "cpu", "--log_samples", "--output_path", str(out),
        processes=processes), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(tmp_path: Path, run: subprocess.Popen, processes: int) -> tuple[str, dict, dict]:
    """A run's stdout, its results JSON, and {task: {doc_id: logged sample}}."""
    stdout, stderr = run.communicate(timeout=WAIT_S)
    assert run.returncode == 0, stderr[-3000:]
    out = tmp_path / f"out{processes}"
    (results_file,) = out.rglob("results_*.json")
    samples = {}
    for file in out.rglob("samples_*.jsonl"):
        lines = [json.loads(line) for line in file.read_text().splitlines()]
        samples[file.name.split("_2")[0].removeprefix("samples_")] = {s["doc_id"]: s for s in lines}
    return stdout, json.loads(results_file.read_text()), samples


@pytest.mark.slow
@needs_data
def test_two_cpu_processes_give_the_single_process_results(masked_dir, tmp_path):
    tasks = tmp_path / "tasks"  # a user's --include_path replaces mdmkit's, so it gets a copy of mdmkit_gsm8k
    tasks.mkdir()
    (tasks / "stop_local.yaml").write_text(STOP_TASK.format(data=BENCHMARK_DATA.resolve()))
    for name in ("mdmkit_gsm8k.yaml", "utils.py"):
        shutil.copy(Path(utils.__file__).parent / name, tasks / name)
    single, parallel = start(tmp_path, masked_dir, tasks, 1), start(tmp_path, masked_dir, tasks, 2)
    one_out, one, one_samples = finish(tmp_path, single, 1)
    two_out, two, two_samples = finish(tmp_path, parallel, 2)

    assert one["results"] == two["results"]
    assert one["n-shot"] == two["n-shot"] == {"stop_local": 0, "mdmkit_gsm8k": 8}
    assert set(one_samples) == set(two_samples) == {"stop_local", "mdmkit_gsm8k"}
    for task, by_doc in one_samples.items():
        assert sorted(by_doc) == sorted(two_samples[task]) == [0, 1, 2, 3, 4]
        for doc_id, sample in by_doc.items():
            other = two_samples[task][doc_id]
            for field in ("arguments", "filtered_resps", "mdmkit_nfe", "mdmkit_nfe_to_stop"):
                assert sample[field] == other[field], (task, doc_id, field)
            # lm-eval appends its padding answers to the padded request's own: the first is the answer
            assert [answers[0] for answers in sample["resps"]] == [answers[0] for answers in other["resps"]]
    stops = [s["mdmkit_nfe_to_stop"][0] for s in one_samples["stop_local"].values()]
    assert len(set(stops)) > 1 and min(stops) < 12  # rows stopped at different points: NFE is per request
    gsm8k = one["results"]["mdmkit_gsm8k"]
    assert gsm8k["nfe,none"] == pytest.approx(sum(s["nfe"] for s in one_samples["mdmkit_gsm8k"].values()) / 5)

    # the model's NFE summary in the results JSON, from every rank's records
    assert one["config"]["mdmkit"]["nfe"] == two["config"]["mdmkit"]["nfe"]
    assert one["config"]["mdmkit"]["nfe"]["stop_local"]["generations"] == 5
    assert (one["config"]["mdmkit"]["world_size"], two["config"]["mdmkit"]["world_size"]) == (1, 2)
    # the per-request NFE file holds each document once: lm-eval's padding request is not counted
    lines = {out: sorted((r["task"], r["doc_id"], r["nfe"], r["nfe_to_stop"]) for r in map(
        json.loads, (tmp_path / out / "nfe.jsonl").read_text().splitlines())) for out in ("out1", "out2")}
    assert lines["out1"] == lines["out2"] and len(lines["out1"]) == 10
    assert "[mdmkit] 10 generations: NFE mean" in one_out
    assert two_out.count("[mdmkit] 10 generations on 2 ranks: NFE mean") == 1  # rank 0 alone reports

"""SDAR (`hf.kind=sdar` with its own decoder, `sampler=sdar`) and LLaDA2.1's decoder (`sampler=llada2_1` on
`hf.kind=llada2`) through `evaluate.py task=gsm8k` and `mdmkit-lm-eval --tasks mdmkit_gsm8k`: one answer, document
by document, in tokens and forwards.

SDAR runs on the tiny example model `python -m mdmkit.models.llm.tiny --kind sdar` makes; LLaDA2.1 on the LLaDA2.0
fixture (`../shared/reference_models/llada2_mini`, LLaDA2.1's network) made a user checkpoint directory. The
weights are random: what is checked is that each path runs and that both give one answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import BENCHMARK_DATA, REFERENCE_MODELS, compose_config
from one_answer import assert_one_answer, generations, lm_eval_samples
from tiny_text_models import native_checkpoint_dir

GEN, MAX_LENGTH, DOCS = 16, 160, 2
# kind, the evaluate.py overrides of the sampler, the same as mdmkit-lm-eval's model_args; SDAR greedy (top_k 1):
# a draw from the softmax could turn on float32 sums, which differ with the threads each path runs on
CASES = {"sdar": ("sdar", ["sampler=sdar", "sampler.rule.top_k=1"], "sampler=sdar,rule.top_k=1"),
         "llada2_1": ("llada2", ["sampler=llada2_1", "sampler.block_size=16"], "sampler=llada2_1,block_size=16")}
pytestmark = [pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                                 reason=f"benchmark data not found: {BENCHMARK_DATA}"),
              pytest.mark.usefixtures("one_thread")]


def checkpoint(case: str, directory: Path) -> Path:
    if case == "sdar":
        from mdmkit.models.llm.tiny import make_tiny_model

        return make_tiny_model("sdar", directory)
    fixture = REFERENCE_MODELS / "llada2_mini"
    if not (fixture / "model.safetensors").is_file():
        pytest.skip(f"reference model fixture not found: {fixture}")
    return native_checkpoint_dir(fixture, "llada2", directory)


@pytest.mark.parametrize("case", CASES)
def test_evaluate_and_lm_eval_give_one_answer(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    kind, sampler, sampler_args = CASES[case]
    model = checkpoint(case, tmp_path / "model")
    cfg = compose_config("evaluate", [
        "task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0", f"task.max_gen_len={GEN}", f"ckpt={model}",
        f"hf.kind={kind}", f"hf.max_length={MAX_LENGTH}", f"limit={DOCS}", f"batch_size={DOCS}", "device=cpu",
        f"results_file={tmp_path / 'rows.jsonl'}", "wandb.mode=disabled", *sampler])
    threads = torch.get_num_threads()
    (row,) = run_evaluation(plan_evaluation(cfg))
    torch.set_num_threads(threads)
    assert row["n"] == DOCS and row["nfe"]["min"] >= 1
    samples = lm_eval_samples(monkeypatch, f"ckpt={model},kind={kind},max_length={MAX_LENGTH},{sampler_args}",
                              GEN, DOCS, DOCS, num_fewshot=0)
    assert_one_answer(samples, generations(tmp_path, row))

"""Fast-dLLM v2 (`hf.kind=fast_dllm_v2`) everywhere a model goes: its checkpoint directory with the hub tokenizer
configs and chat template, `evaluate.py task=gsm8k` and `mdmkit-lm-eval --tasks mdmkit_gsm8k`, with block
diffusion (`sampler=fast_dllm_v2`, exact and with the sub-block cache, and any rule inside the blocks).

The fixture (`../shared/reference_models/fast_dllm_v2`) becomes a user checkpoint directory with a tiny byte-level
tokenizer (`tiny_text_models.native_checkpoint_dir`); the network is random, so what is checked is that each path
runs, what each row reports, and that both evaluation paths give one answer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import BENCHMARK_DATA, ROOT, compose_config, run_cli
from omegaconf import open_dict
from one_answer import assert_one_answer, generations, lm_eval_samples
from tiny_text_models import CHAT_TOKENS, native_checkpoint_dir

from mdmkit.models.llm.diffusion_lm import DiffusionLM

FIXTURE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models")) / "fast_dllm_v2"
needs_model = pytest.mark.skipif(not (FIXTURE / "model.safetensors").is_file(),
                                 reason=f"Fast-dLLM v2 reference fixture not found: {FIXTURE}")
needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")
pytestmark = [needs_model, pytest.mark.usefixtures("one_thread")]
pytest.importorskip("transformers")
KIND, GEN, MAX_LENGTH = "fast_dllm_v2", 24, 160
BLOCKS = ["sampler.block_size=16", "sampler.sub_block=4"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return native_checkpoint_dir(FIXTURE, KIND, tmp_path_factory.mktemp("native") / KIND)


def test_the_checkpoint_loads_with_its_tokenizer_and_chat_template(checkpoint: Path) -> None:
    from mdmkit import api

    model = api.load_text_model(str(checkpoint), KIND)
    network, tokenizer = model.network, model.tokenizer
    assert isinstance(network, DiffusionLM) and network.config.attention_block == 32
    assert network.mask_id == tokenizer.convert_tokens_to_ids("|<MASK>|") == 1023  # not declared as mask_token
    assert tokenizer.mask_token_id is None and tokenizer.eos_token == "<|im_end|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert all(token in chat for token in CHAT_TOKENS[KIND]) and chat.endswith("<|im_start|>assistant\n")
    sampler = api.sampler("fast_dllm_v2", block_size=16, sub_block=4)
    made = api.generate(model, ["What is 2 + 2?", "Say hi."], sampler, GEN, chat=True, progress=False)
    assert len(made.texts) == 2 and (made.nfe >= 2).all()


def evaluate_overrides(checkpoint: Path, results: Path, *sampler: str) -> list[str]:
    return ["task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", f"task.max_gen_len={GEN}", f"ckpt={checkpoint}",
            f"hf.kind={KIND}", f"hf.max_length={MAX_LENGTH}", "limit=2", "batch_size=2", "device=cpu",
            f"results_file={results}", "wandb.mode=disabled", *sampler]


@needs_data
def test_evaluate_and_lm_eval_give_one_answer_with_and_without_the_sub_block_cache(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    results = tmp_path / "rows.jsonl"
    cfg = compose_config("evaluate", evaluate_overrides(checkpoint, results, "sampler=fast_dllm_v2", *BLOCKS))
    with open_dict(cfg):
        cfg.sweep = {"name": "block_cache", "entries": [
            {"sampler": "fast_dllm_v2", "grid": {"block_cache": [False, True], "block_size": [16], "sub_block": [4]}}]}
    threads = torch.get_num_threads()
    rows = run_evaluation(plan_evaluation(cfg))
    torch.set_num_threads(threads)
    assert [row["sampler"]["block_cache"] for row in rows] == [False, True]
    for row in rows:
        assert row["family"] == "blockdiffusion-threshold-confidence" and row["n"] == 2
        # a block of 16 over 24 answer tokens: at least a forward per block and a commit between them
        assert 3 <= row["nfe"]["min"] and row["nfe_to_stop_mean"] <= row["nfe_mean"]
        cache = str(row["sampler"]["block_cache"]).lower()
        samples = lm_eval_samples(monkeypatch, f"ckpt={checkpoint},kind={KIND},max_length={MAX_LENGTH},"
                                               f"sampler=fast_dllm_v2,block_size=16,sub_block=4,block_cache={cache}",
                                  GEN, 2, 2)
        assert_one_answer(samples, generations(tmp_path, row))
    exact, approximate = rows
    assert approximate["tokens_per_forward_mean"] < exact["tokens_per_forward_mean"]  # sub-block steps are narrower


@needs_data
def test_the_evaluate_cli_runs_another_rule_inside_the_blocks(checkpoint: Path, tmp_path: Path) -> None:
    results = tmp_path / "rows.jsonl"
    done = run_cli("evaluate.py", *evaluate_overrides(checkpoint, results, "sampler=block_diffusion", *BLOCKS,
                                                      "sampler@sampler.rule=topk", "sampler.rule.k=2"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["family"] == "blockdiffusion-topk-confidence" and row["sampler"]["rule"]["k"] == 2
    # two tokens a forward inside the blocks, one from each committing forward
    assert row["nfe"]["max"] <= GEN // 2 + 2


def test_lm_eval_model_args_reach_the_rule_inside_the_blocks() -> None:
    pytest.importorskip("lm_eval")
    from mdmkit.core.errors import ConfigError
    from mdmkit.evaluation.lm_eval_model import sampler_from_args
    from mdmkit.samplers import TopKSampler

    sampler, config = sampler_from_args("fast_dllm_v2", {"rule.tau": 0.5, "block_cache": True})
    assert sampler.rule.tau == config["rule"]["tau"] == 0.5 and sampler.block_cache
    # another rule in place of the preset's (as its own file states), then its fields
    sampler, config = sampler_from_args("block_diffusion", {"rule.k": 2, "rule": "topk", "rule.cache": None})
    assert isinstance(sampler.rule, TopKSampler) and sampler.rule.k == 2 and config["rule"]["cache"] == "none"
    with pytest.raises(ConfigError, match="rule.tau: sampler eb has no nested sampler 'rule'"):
        sampler_from_args("eb", {"rule.tau": 0.5})

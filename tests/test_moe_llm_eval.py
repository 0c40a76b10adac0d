"""LLaDA-MoE (`hf.kind=llada_moe`) and LLaDA2.0 (`hf.kind=llada2`) everywhere a model goes: their checkpoint
directories with a tokenizer, every sampler option, `evaluate.py task=gsm8k` and `mdmkit-lm-eval --tasks
mdmkit_gsm8k` giving one answer.

The fixtures (`../shared/reference_models/llada_moe`, `llada2_mini`) become user checkpoint directories with a tiny
byte-level tokenizer (`tiny_text_models.native_checkpoint_dir`) on LLaDA2.0's hub tokenizer configs (LLaDA-MoE's
were not found; the two models share the vocabulary's size and special ids: eos 156892, mask 156895). The networks
are random: what is checked is that each path runs, what each row reports, and that both paths agree.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import torch
from conftest import BENCHMARK_DATA, ROOT, compose_config
from omegaconf import open_dict
from one_answer import assert_one_answer, generations, lm_eval_samples
from tiny_text_models import native_checkpoint_dir

from mdmkit import api
from mdmkit.core.errors import CapabilityError
from mdmkit.models.llm.diffusion_lm import DiffusionLM

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
FOLDER = {"llada_moe": "llada_moe", "llada2": "llada2_mini"}
HUB_TOKENIZER = REFERENCE / "llada2_mini" / "hub_tokenizer"
pytestmark = [pytest.mark.skipif(not all((REFERENCE / f / "model.safetensors").is_file() for f in FOLDER.values()),
                                 reason=f"reference model fixtures not found: {REFERENCE}"),
              pytest.mark.usefixtures("one_thread")]
needs_data = pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                                reason=f"benchmark data not found: {BENCHMARK_DATA}")
MASK_ID, GEN, MAX_LENGTH = 1023, 16, 160
SAMPLER_OPTIONS = sorted(path.stem for path in (ROOT / "conf" / "sampler").glob("*.yaml"))
# refused in one line, as on LLaDA and Dream: NI reads hidden states, self-speculation needs a causal head,
# revisable decoding a canvas network (DiffusionGemma)
NEEDS_OTHER_NETWORKS = {"ni", "ni_eb", "ni_threshold", "speculative", "diffusion_gemma"}
BLOCK_CAUSAL_ONLY = {"block_diffusion", "fast_dllm_v2", "llada2", "llada2_1", "llada2_1_cached", "sdar"}
# the evaluation presets: LLaDA's low-confidence generate for LLaDA-MoE (and its caches), LLaDA2.0's own generate
PRESETS = {"llada_moe": ["sampler=llada", "sampler.block_length=8", "sampler.steps=4"],
           "llada2": ["sampler=llada2", "sampler.block_size=16", "sampler.sub_block=16", "sampler.rule.steps=4"]}
GRIDS = {"llada_moe": {"cache": ["none", "prefix", "dual"], "block_length": [8], "steps": [4]}}  # LLaDA2.0: one run
LM_EVAL_ARGS = {"llada_moe": "sampler=llada,block_length=8,steps=4,cache={cache}",
                "llada2": "sampler=llada2,block_size=16,sub_block=16,rule.steps=4"}


@cache
def network(kind: str) -> DiffusionLM:
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(REFERENCE / FOLDER[kind], kind, mask_id=MASK_ID)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("native")
    return {kind: native_checkpoint_dir(REFERENCE / folder, kind, root / kind, hub_tokenizer=HUB_TOKENIZER)
            for kind, folder in FOLDER.items()}


@pytest.mark.parametrize("kind", FOLDER)
def test_the_checkpoint_loads_with_its_tokenizer_and_chat_template(kind: str, checkpoints: dict[str, Path]) -> None:
    model = api.load_text_model(str(checkpoints[kind]), kind)
    network, tokenizer = model.network, model.tokenizer
    assert isinstance(network, DiffusionLM) and network.config.moe is not None
    # LLaDA2.0's config names no mask token: its tokenizer's <|mask|> is used; LLaDA-MoE's config names it
    assert network.mask_id == tokenizer.mask_token_id == tokenizer.convert_tokens_to_ids("<|mask|>") == MASK_ID
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 1000
    assert network.config.attention_block == (32 if kind == "llada2" else None)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<role>HUMAN</role>2 + 2?<|role_end|><role>ASSISTANT</role>")
    assert network.active_parameters() < network.num_parameters()


@pytest.mark.parametrize("kind", FOLDER)
@pytest.mark.parametrize("option", SAMPLER_OPTIONS)
def test_every_sampler_option_runs_or_says_in_one_line_why_not(option: str, kind: str) -> None:
    net = network(kind)
    refused = option in NEEDS_OTHER_NETWORKS or (kind == "llada_moe" and option in BLOCK_CAUSAL_ONLY)
    if refused:
        with pytest.raises(CapabilityError) as caught:
            api.fill(net, [[5, 6, 7, 8], [9, 10, 11, 12]], api.sampler(option, net), 12, MASK_ID)
        assert "\n" not in str(caught.value)
        return
    filled = api.fill(net, [[5, 6, 7, 8], [9, 10, 11, 12]], api.sampler(option, net), 12, MASK_ID, seed=1)
    assert not (filled.tokens == MASK_ID).any() and (filled.nfe >= 1).all()


def evaluate_overrides(kind: str, checkpoint: Path, results: Path) -> list[str]:
    return ["task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0", f"task.max_gen_len={GEN}",
            f"ckpt={checkpoint}", f"hf.kind={kind}", f"hf.max_length={MAX_LENGTH}", "limit=2", "batch_size=2",
            "device=cpu", f"results_file={results}", "wandb.mode=disabled", *PRESETS[kind]]


@needs_data
@pytest.mark.parametrize("kind", FOLDER)
def test_evaluate_and_lm_eval_give_one_answer(kind: str, checkpoints: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.evaluation.evaluate import run_evaluation
    from mdmkit.evaluation.plan import plan_evaluation

    results = tmp_path / "rows.jsonl"
    cfg = compose_config("evaluate", evaluate_overrides(kind, checkpoints[kind], results))
    if kind in GRIDS:
        with open_dict(cfg):
            cfg.sweep = {"name": "moe", "entries": [{"sampler": "llada", "grid": GRIDS[kind]}]}
    threads = torch.get_num_threads()
    rows = run_evaluation(plan_evaluation(cfg))
    torch.set_num_threads(threads)
    assert len(rows) == (3 if kind == "llada_moe" else 1)
    if kind == "llada2":
        assert rows[0]["family"] == "blockdiffusion-llada2" and rows[0]["sampler"]["rule"]["steps"] == 4
    else:
        assert [row["sampler"]["cache"] for row in rows] == ["none", "prefix", "dual"]
    net = network(kind)
    for row in rows:
        assert row["n"] == 2 and row["nfe"]["min"] >= 2
        # the row records what a token's forward runs beside the total (the experts it is not sent to left out)
        assert row["parameters"] == {"total": net.num_parameters(), "active_per_token": net.active_parameters()}
        sampler = LM_EVAL_ARGS[kind].format(cache=row["sampler"].get("cache"))
        samples = lm_eval_samples(monkeypatch, f"ckpt={checkpoints[kind]},kind={kind},max_length={MAX_LENGTH},"
                                               f"{sampler}", GEN, 2, 2, num_fewshot=0)
        assert_one_answer(samples, generations(tmp_path, row))

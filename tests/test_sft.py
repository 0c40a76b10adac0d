"""Supervised fine-tuning of LLaDA and Dream on the tiny reference models: the loss against a hand computation, the
prompt never scored, LoRA merged = unmerged, save -> reload, two processes = one with accumulation, and a short
run that learns GSM8K pairs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import BENCHMARK_DATA, ROOT, compose_config, run_cli
from tiny_text_models import native_checkpoint_dir

from mdmkit.core.errors import ConfigError, DataFormatError
from mdmkit.core.seeding import seeded_generator
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.lora import add_lora, load_adapter, save_adapter
from mdmkit.objectives import MaskedDiffusionLoss
from mdmkit.training.sft.config import SFTConfig
from mdmkit.training.sft.data import encode
from mdmkit.training.sft.pairs import Pair, read_pairs
from mdmkit.training.sft.train import plain_network

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
pytestmark = [
    pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"no reference fixtures at {REFERENCE}"),
    pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_train.jsonl").is_file(), reason=f"no GSM8K at {BENCHMARK_DATA}"),
]
END_OF_TURN = {"llada": "<|eot_id|>", "dream": "<|im_end|>"}
SHORT = 190  # characters of question + answer: GSM8K pairs that fit the fixtures' 256 positions (byte tokens)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft-models")
    return {kind: native_checkpoint_dir(REFERENCE / kind, kind, root / kind) for kind in ("llada", "dream")}


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shortest real GSM8K training pairs: the question, the worked solution ending "The answer is N."."""
    from mdmkit.tasks.gsm8k import worked_solution

    rows = [json.loads(line) for line in (BENCHMARK_DATA / "gsm8k_train.jsonl").read_text().splitlines()]
    pairs = [{"prompt": row["question"], "response": worked_solution(row["answer"])} for row in rows]
    short = [pair for pair in pairs if len(pair["prompt"]) + len(pair["response"]) < SHORT][:48]
    path = tmp_path_factory.mktemp("sft-data") / "pairs.jsonl"
    path.write_text("".join(json.dumps(pair) + "\n" for pair in short))
    return path


def sft_config(directory: Path, kind: str, **fields) -> SFTConfig:
    return SFTConfig(model=str(directory), kind=kind, end_of_turn=END_OF_TURN[kind], max_length=256, **fields)


def examples(model_dirs: dict[str, Path], pairs_file: Path, kind: str, rows: int = 3):
    network, tokenizer = load_native(str(model_dirs[kind]), kind)
    made = encode(read_pairs(pairs_file)[:rows], tokenizer, sft_config(model_dirs[kind], kind))
    return network, tokenizer, made


# -- the data ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_pairs_render_through_the_chat_template_and_pad_with_eos(model_dirs, pairs_file, kind) -> None:
    _, tokenizer, made = examples(model_dirs, pairs_file, kind)
    pair = read_pairs(pairs_file)[0]
    text = tokenizer.apply_chat_template(pair.prompt, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer = tokenizer(pair.response, add_special_tokens=False)["input_ids"]
    start, end = len(prompt), len(prompt) + len(answer)
    assert made.tokens[0, :start].tolist() == prompt and made.tokens[0, start:end].tolist() == answer
    assert made.tokens[0, end].item() == tokenizer.convert_tokens_to_ids(END_OF_TURN[kind])
    assert set(made.tokens[0, end + 1:].tolist()) <= {tokenizer.eos_token_id}  # EOS padding
    assert not made.answer_mask[0, :start].any() and made.answer_mask[0, start:].all()  # padding counts as answer
    assert made.lengths[0].item() == end + 1 and made.tokens.shape[1] == int(made.lengths.max())


def test_malformed_pairs_stop_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(DataFormatError, match=r"bad.jsonl:2: expected"):
        read_pairs(bad)
    bad.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n')
    with pytest.raises(DataFormatError, match=r":1: the last message is the answer"):
        read_pairs(bad)
    bad.write_text("{not json\n")
    with pytest.raises(DataFormatError, match=r":1: not JSON"):
        read_pairs(bad)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "r"}]}) + "\n")
    assert read_pairs(chat) == [Pair([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "r")]


def test_bad_settings_are_one_line_errors(model_dirs, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        SFTConfig(model=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="lora_targets=.*each must be one of"):
        SFTConfig(model=str(model_dirs["llada"]), lora_targets=["q_proj"])
    with pytest.raises(ConfigError, match="dtype=bfloat16 with lora_r=0 would train bfloat16 weights"):
        SFTConfig(model=str(model_dirs["llada"]), dtype="bfloat16")
    with pytest.raises(ConfigError, match="lora_r=-1"):
        SFTConfig(model=str(model_dirs["llada"]), lora_r=-1)
    from mdmkit.evaluation.text_eval import HFModelConfig

    with pytest.raises(ConfigError, match="adapter: LoRA adapters merge into mdmkit's own"):
        HFModelConfig(kind="generic", adapter=str(tmp_path))
    with pytest.raises(ConfigError, match="adapter=.*: no such directory"):
        HFModelConfig(kind="llada", adapter=str(tmp_path / "absent"))
    _, tokenizer = load_native(str(model_dirs["llada"]), "llada")
    with pytest.raises(DataFormatError, match="end_of_turn='<nope>' is not a token"):
        encode([Pair([{"role": "user", "content": "q"}], "r")], tokenizer,
               SFTConfig(model=str(model_dirs["llada"]), end_of_turn="<nope>"))


# -- the loss ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, normalize", [("llada", "sequence"), ("dream", "tokens")])
def test_loss_equals_a_hand_computation_on_a_fixed_draw(model_dirs, pairs_file, kind, normalize) -> None:
    network, _, made = examples(model_dirs, pairs_file, kind)
    objective = MaskedDiffusionLoss(stratified=False, normalize=normalize)
    with torch.no_grad():
        loss, _ = objective(network, made.tokens, made.answer_mask, network.mask_id, seeded_generator(7))
        draw = objective.corrupt(made.tokens, made.answer_mask, network.mask_id, seeded_generator(7))
        # the network's own outputs, unshifted: Dream's output at i - 1 predicts token i, LLaDA's at i
        raw = F.linear(network.norm(network.hidden(draw.noisy)), network.head.weight).double()
    shift = 1 if kind == "dream" else 0
    totals, answers = [], []
    for b in range(len(made.tokens)):
        total = 0.0
        for i in range(made.tokens.shape[1]):
            if draw.masked[b, i]:
                total -= torch.log_softmax(raw[b, i - shift], -1)[made.tokens[b, i]].item() / draw.t[b].item()
        totals.append(total)
        answers.append(int(made.answer_mask[b].sum()))
    if normalize == "sequence":  # LLaDA: by each answer's length (EOS padding included), mean over sequences
        expected = sum(t / n for t, n in zip(totals, answers)) / len(totals)
    else:  # Dream: the batch's sum over its answer tokens
        expected = sum(totals) / sum(answers)
    assert draw.masked.any() and len(set(answers)) > 1  # a real draw over answers of several lengths
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert ((draw.t >= 1e-3) & (draw.t < 1)).all()


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_prompt_positions_are_never_masked_nor_scored(model_dirs, pairs_file, kind) -> None:
    network, _, made = examples(model_dirs, pairs_file, kind)
    objective = MaskedDiffusionLoss(stratified=False)
    prompt = ~made.answer_mask
    for seed in range(20):
        draw = objective.corrupt(made.tokens, made.answer_mask, network.mask_id, seeded_generator(seed))
        assert torch.equal(draw.noisy[prompt], made.tokens[prompt])
    with torch.no_grad():
        logits = network(made.tokens).requires_grad_()
    loss, _ = objective(lambda tokens: logits, made.tokens, made.answer_mask, network.mask_id, seeded_generator(3))
    loss.backward()
    assert logits.grad[prompt].abs().max() == 0 and logits.grad[made.answer_mask].abs().max() > 0


# -- LoRA ----------------------------------------------------------------------------------------------------------

def test_lora_merged_logits_equal_the_unmerged_model(model_dirs, pairs_file, tmp_path: Path) -> None:
    config = sft_config(model_dirs["llada"], "llada", lora_r=4, lora_targets=("q", "v", "up", "down"))
    network, _, made = examples(model_dirs, pairs_file, "llada")
    base = {name: tensor.clone() for name, tensor in network.state_dict().items()}
    add_lora(network, config.lora)
    torch.manual_seed(0)
    with torch.no_grad():  # adapters as training leaves them (peft starts B at zero: merged = base, trivially)
        for name, parameter in network.named_parameters():
            if ".lora_" in name:
                parameter.normal_(0, 0.3)
    trained = [name for name, p in network.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in name for name in trained)
    with torch.no_grad():
        unmerged = network(made.tokens)
        merged = plain_network(network.state_dict(), network.config, config)(made.tokens)
        plain = load_native(str(model_dirs["llada"]), "llada")[0]
        before = plain(made.tokens)
        saved = save_adapter(network.state_dict(), config.lora, tmp_path / "adapter")
        adapter = load_adapter(plain, saved)(made.tokens)
    assert (unmerged - before).abs().max() > 1e-2  # the adapters change the model
    assert (merged - unmerged).abs().max() < 1e-4 * unmerged.abs().max(), (merged - unmerged).abs().max()
    assert (adapter - unmerged).abs().max() < 1e-4 * unmerged.abs().max()
    assert set(plain.state_dict()) == set(base)  # the adapter merged away: plain names again


def test_adapters_train_in_float32_on_a_bfloat16_base(model_dirs) -> None:
    network = add_lora(load_native(str(model_dirs["llada"]), "llada", dtype="bfloat16")[0],
                       sft_config(model_dirs["llada"], "llada", lora_r=2).lora)
    dtypes = {name: p.dtype for name, p in network.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    network(torch.randint(0, 1000, (1, 8))).sum().backward()
    assert network.blocks[0].attn.q.lora_B.default.weight.grad.abs().max() > 0


def test_peft_reads_the_saved_adapter(model_dirs, pairs_file, tmp_path: Path) -> None:
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    config = sft_config(model_dirs["llada"], "llada", lora_r=2)
    network, _, _ = examples(model_dirs, pairs_file, "llada")
    add_lora(network, config.lora)
    directory = save_adapter(network.state_dict(), config.lora, tmp_path / "adapter")
    saved = LoraConfig.from_pretrained(str(directory))
    assert (saved.r, saved.lora_alpha, set(saved.target_modules)) == (2, 32.0, set(config.lora_targets))
    weights = load_file(directory / "adapter_model.safetensors")
    assert all(name.startswith("base_model.model.blocks.") for name in weights)
    fresh = add_lora(load_native(str(model_dirs["llada"]), "llada")[0], config.lora)
    result = set_peft_model_state_dict(fresh, {k.removeprefix("base_model.model."): v for k, v in weights.items()})
    assert not result.unexpected_keys


def test_an_incomplete_or_foreign_adapter_is_refused(model_dirs, pairs_file, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from mdmkit.core.errors import CheckpointError

    config = sft_config(model_dirs["llada"], "llada", lora_r=2)
    network = add_lora(load_native(str(model_dirs["llada"]), "llada")[0], config.lora)
    directory = save_adapter(network.state_dict(), config.lora, tmp_path / "adapter")
    file = directory / "adapter_model.safetensors"
    weights = load_file(file)
    dropped = min(weights)
    save_file({k: v for k, v in weights.items() if k != dropped}, file)
    with pytest.raises(CheckpointError, match="no weights for .*which the adapter's config names"):
        load_adapter(load_native(str(model_dirs["llada"]), "llada")[0], directory)
    save_file({**weights, "base_model.model.blocks.9.attn.q.lora_A.weight": weights[dropped].clone()}, file)
    with pytest.raises(CheckpointError, match="fits no module of this network"):
        load_adapter(load_native(str(model_dirs["llada"]), "llada")[0], directory)


# -- runs ----------------------------------------------------------------------------------------------------------

def sft_overrides(model_dir: Path, pairs_file: Path, out: Path, *extra: str) -> list[str]:
    return [f"sft.model={model_dir}", f"sft.train_file={pairs_file}", "sft.max_length=256", "trainer=cpu",
            "trainer.precision=32-true", "logger=csv", "trainer.enable_progress_bar=false", "data.batch_size=4",
            "data.eval_batch_size=4", "data.val_examples=8", "optim.warmup_steps=0", f"results_file={out}/rows.jsonl",
            f"task.data_dir={BENCHMARK_DATA}", "task.max_gen_len=16", "eval_limit=2", *extra]


def held_out_loss(model_dir: Path, kind: str, made, normalize: str) -> float:
    network = load_native(str(model_dir), kind)[0]
    objective = MaskedDiffusionLoss(stratified=False, normalize=normalize)
    with torch.no_grad():
        return sum(objective(network, made.tokens, made.answer_mask, network.mask_id, seeded_generator(s))[0].item()
                   for s in range(8)) / 8


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_a_short_run_learns_gsm8k_pairs_and_saves_a_hub_checkpoint(model_dirs, pairs_file, kind, tmp_path) -> None:
    """Full fine-tuning, in process: the held-out loss falls; model/ holds the hub's tensor names and reloads."""
    from mdmkit.training.preflight import plan_training
    from mdmkit.training.sft.train import run_sft

    cfg = compose_config("train", [f"experiment={kind}_sft", *sft_overrides(
        model_dirs[kind], pairs_file, tmp_path, "trainer.max_steps=30", "trainer.val_check_interval=15",
        "optim.lr=0.003", "evaluate_after_training=false", "save_dtype=float32")])
    run_sft(plan_training(cfg), tmp_path)
    saved = tmp_path / "model"
    from safetensors import safe_open

    def layout(path: Path) -> dict[str, list[int]]:  # tensor names and shapes
        with safe_open(str(path), "pt") as handle:
            return {name: handle.get_slice(name).get_shape() for name in handle.keys()}  # noqa: SIM118

    assert layout(saved / "model.safetensors") == layout(REFERENCE / kind / "model.safetensors")
    held_out = read_pairs(pairs_file)[-8:]  # the pairs the run held out for validation
    _, tokenizer = load_native(str(saved), kind)
    made = encode(held_out, tokenizer, sft_config(saved, kind))
    normalize = "tokens" if kind == "dream" else "sequence"
    before, after = held_out_loss(model_dirs[kind], kind, made, normalize), held_out_loss(saved, kind, made, normalize)
    assert after < 0.8 * before, (before, after)
    assert "val/loss" in next(tmp_path.rglob("metrics.csv")).read_text().splitlines()[0]


@pytest.mark.slow  # its parts in the default suite: test_lora_saves, test_sft_preflight, test_rl_llm's LoRA resume
def test_lora_run_saves_merged_and_adapter_resumes_and_evaluates(model_dirs, pairs_file, tmp_path: Path) -> None:
    """The CLI as a user runs it: LoRA, the evaluation after training with a cached sampler, then a resume by the
    run's directory. The merged model equals the base with the saved adapter, and so do their generations."""
    overrides = sft_overrides(model_dirs["llada"], pairs_file, tmp_path, "sft.lora_r=4", "trainer.max_steps=4",
                              "trainer.val_check_interval=2", "optim.lr=0.01", "sampler.cache=dual",
                              "sampler.steps=8", "save_dtype=float32")
    out = run_cli("train.py", "experiment=llada_sft", *overrides, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run = next((tmp_path / "outputs" / "llada_sft").iterdir())
    row = json.loads((tmp_path / "rows.jsonl").read_text().splitlines()[-1])
    assert row["kind"] == "sft" and row["task"] == "gsm8k" and row["trained"]["method"] == "lora"
    assert row["sampler"]["cache"] == "dual" and row["nfe_mean"] > 0 and "accuracy" in row
    network, tokenizer = load_native(str(run / "model"), "llada")
    adapted = load_adapter(load_native(str(model_dirs["llada"]), "llada")[0], run / "adapter")
    made = encode(read_pairs(pairs_file)[:2], tokenizer, sft_config(run / "model", "llada"))
    with torch.no_grad():
        base = load_native(str(model_dirs["llada"]), "llada")[0](made.tokens)
        assert (network(made.tokens) - base).abs().max() > 1e-3  # training changed the model
        assert torch.allclose(network(made.tokens), adapted(made.tokens), atol=1e-5, rtol=1e-5)

    # evaluate.py on the base model with the adapter merged in: the generations of the run's own evaluation
    evaluated = run_cli("evaluate.py", "task=gsm8k", f"ckpt={model_dirs['llada']}", f"hf.adapter={run / 'adapter'}",
                        "hf.kind=llada", "task.chat=true", "task.shots=0", f"task.data_dir={BENCHMARK_DATA}",
                        "task.max_gen_len=16", "limit=2", "sampler=llada", "sampler.cache=dual", "sampler.steps=8",
                        f"results_file={tmp_path}/adapter/rows.jsonl", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    generations = [[json.loads(line)["raw"] for line in file.read_text().splitlines()]
                   for file in (run / "generations.jsonl", next((tmp_path / "adapter" / "generations").glob("*")))]
    assert generations[0] == generations[1] and len(generations[0]) == 2

    resumed = run_cli("train.py", f"ckpt_path={run}", "trainer.max_steps=6", "evaluate_after_training=false",
                      cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    calls = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]
    assert [call["global_step"] for call in calls] == [4, 6]
    # a LoRA checkpoint holds the adapters only, and refuses another base than the one they were trained on
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["state_dict"] and all(".lora_" in name for name in saved["state_dict"])
    other = tmp_path / "other_base"
    shutil.copytree(model_dirs["llada"], other)
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()), "note": 1}))
    refused = run_cli("train.py", f"ckpt_path={run}", "trainer.max_steps=8", f"sft.model={other}", cwd=tmp_path)
    assert refused.returncode != 0 and "is not the base model this checkpoint's adapters were" in refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr[-3000:]


def _steps(run: Path) -> list[dict[str, torch.Tensor]]:
    files = sorted((run / "checkpoints").glob("step*.ckpt"))
    return [torch.load(file, map_location="cpu", weights_only=False)["state_dict"] for file in files]


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_with_accumulation(model_dirs, pairs_file, tmp_path: Path) -> None:
    """Data parallel over 2 CPU processes = 1 process accumulating 2 batches: the same weights after every step."""
    common = sft_overrides(model_dirs["llada"], pairs_file, tmp_path, "trainer.max_steps=3", "checkpoint_every=1",
                           "trainer.val_check_interval=3", "data.batch_size=2", "optim.lr=0.003",
                           "evaluate_after_training=false", "seed=3")
    runs = {}
    for name, extra in {"ddp": ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
                        "accumulated": ["trainer.accumulate_grad_batches=2"]}.items():
        out = run_cli("train.py", "experiment=llada_sft", *common, *extra, f"run_name={name}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = _steps(next((tmp_path / "outputs" / name).iterdir()))
    assert len(runs["ddp"]) == len(runs["accumulated"]) == 3
    start = load_native(str(model_dirs["llada"]), "llada")[0].state_dict()
    for step, (ddp, accumulated) in enumerate(zip(runs["ddp"], runs["accumulated"]), 1):
        assert ddp.keys() == accumulated.keys()
        moved = max((ddp[f"network.{k}"] - v).abs().max().item() for k, v in start.items())
        assert moved > 1e-4, f"step {step}: training did not change the weights"
        for name in ddp:
            assert torch.allclose(ddp[name], accumulated[name], atol=1e-6, rtol=1e-5), (step, name)


def test_a_missing_model_directory_is_one_line(tmp_path: Path) -> None:
    out = run_cli("train.py", "experiment=llada_sft", f"sft.model={tmp_path}/absent", "trainer=cpu", cwd=tmp_path)
    assert out.returncode != 0
    assert f"model={tmp_path}/absent: no such directory" in out.stderr and "Traceback" not in out.stderr

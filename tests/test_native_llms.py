"""mdmkit's own LLaDA and Dream networks against the official remote code's outputs.

The fixtures (`../shared/reference_models`, or `$MDMKIT_REFERENCE_MODELS`) are tiny random checkpoints in the
hub's exact format, with the logits and `diffusion_generate` tokens that the unmodified hub code computed for
them under transformers 4.57 (see their README). Nothing here downloads or runs remote code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose_config
from tiny_text_models import CHAT_TOKENS, MASK_TOKEN, native_checkpoint_dir, sharded_copy

from mdmkit.core.config import build
from mdmkit.core.errors import CheckpointError
from mdmkit.models.denoiser import KV_CACHE, KVCache
from mdmkit.models.llm.checkpoints import load_diffusion_lm
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.samplers import ForwardCounter

REFERENCE = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))
pytestmark = [
    pytest.mark.skipif(not (REFERENCE / "dream" / "expected.safetensors").is_file(),
                       reason=f"reference model fixtures not found: {REFERENCE}"),
    pytest.mark.usefixtures("one_thread"),
]
KINDS = ["llada", "dream"]


def expected(kind: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(REFERENCE / kind / "expected.safetensors")


def aligned(kind: str, logits: torch.Tensor) -> torch.Tensor:
    """The hub model's raw logits as mdmkit's network returns them (Dream's output i-1 predicts token i)."""
    return torch.cat([logits[:, :1], logits[:, :-1]], 1) if kind == "dream" else logits


@pytest.fixture(scope="module", params=KINDS)
def reference(request: pytest.FixtureRequest) -> tuple[str, DiffusionLM, dict[str, torch.Tensor]]:
    kind = request.param
    return kind, load_diffusion_lm(REFERENCE / kind, kind), expected(kind)


# -- logits ------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_logits_equal_the_remote_codes(reference) -> None:
    kind, network, data = reference
    ids, keep = data["input_ids"], data["keep"]
    assert network.mask_id == 1023 and network.shift == (kind == "dream")
    assert network.embed.weight.dtype == torch.float32
    full = network(ids)
    assert full.dtype == torch.float32
    torch.testing.assert_close(full, aligned(kind, data["logits_full"]), atol=1e-5, rtol=0)
    if kind == "llada":  # LLaDA's 2-D attention_mask hides padded keys from every query, positions stay 0..L-1
        padded = network(ids, keep[:, None, None, :])
    else:  # Dream's sampler: a 4-D mask keep_q & keep_k, position ids counted from the first real token
        padded = network(ids, keep[:, None, None, :] & keep[:, None, :, None], positions=data["position_ids_padded"])
    torch.testing.assert_close(padded, aligned(kind, data["logits_padded"]), atol=1e-5, rtol=0)


@torch.no_grad()
def test_logits_at_some_columns_are_those_columns_of_the_whole_output(reference) -> None:
    # the output layer runs on the asked columns only; Dream's shift reads the column left of the first one
    _, network, data = reference
    ids = data["input_ids"]
    whole = network(ids)
    for columns in (slice(0, 9), slice(1, 2), slice(20, ids.shape[1])):
        torch.testing.assert_close(network(ids, logits_at=columns), whole[:, columns], atol=1e-6, rtol=0)


@torch.no_grad()
def test_key_padding_masks_as_samplers_pass_them_match_at_every_real_token(reference) -> None:
    # Samplers pass only a key-padding mask [B, 1, 1, L]. Dream's network then counts positions from each row's
    # first real token, as Dream's sampler does; only padded queries differ (they attend to nothing in the
    # reference), and no real token reads them.
    kind, network, data = reference
    ids, keep = data["input_ids"], data["keep"]
    ours, hub = network(ids, keep[:, None, None, :]), data["logits_padded"]
    if kind == "dream":  # ours[:, i] is the hub's output of query i - 1
        ours, hub, keep = ours[:, 1:], hub[:, :-1], keep[:, :-1]
    torch.testing.assert_close(ours[keep], hub[keep], atol=1e-5, rtol=0)


@torch.no_grad()
def test_bfloat16_weights_stay_close_to_float32(reference) -> None:
    kind, network, data = reference
    half = load_diffusion_lm(REFERENCE / kind, kind, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    logits = half(data["input_ids"])
    assert logits.dtype == torch.float32  # samplers always read float32 logits
    assert (logits - network(data["input_ids"])).abs().max() < 0.2  # logits span about +-2.5


@torch.no_grad()
def test_a_sharded_checkpoint_loads_like_a_single_file(reference, tmp_path: Path) -> None:
    kind, network, data = reference
    sharded_copy(REFERENCE / kind, tmp_path)
    sharded = load_diffusion_lm(tmp_path, kind)
    assert torch.equal(sharded(data["input_ids"]), network(data["input_ids"]))


# -- KV cache ------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_a_cached_prefix_gives_the_logits_of_one_full_forward(reference) -> None:
    # The full forward lets the first n tokens attend only to themselves, so their keys and values at every layer
    # are those of the first chunk alone; the rest attend to everything. The same computation in two chunks: the
    # first commits its keys and values, the second attends to them and to itself.
    kind, network, data = reference
    ids, n = data["input_ids"], 10
    length = ids.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool)
    allowed[:n, n:] = False
    full = network(ids, allowed)
    assert KV_CACHE in network.capabilities and network.n_layers == 2
    cache = KVCache.empty(network.n_layers)
    first = network(ids[:, :n], cache=cache, commit=n)
    assert cache.length == n
    second = network(ids[:, n:], positions=torch.arange(n, length)[None], cache=cache)
    assert cache.length == n  # commit=0: queries only
    torch.testing.assert_close(first, full[:, :n], atol=1e-5, rtol=0)
    # Dream's shift is within a call: the second chunk's first token keeps its own output
    skip = 1 if kind == "dream" else 0
    torch.testing.assert_close(second[:, skip:], full[:, n + skip:], atol=1e-5, rtol=0)
    # commit=k appends only the first k tokens of the call, at the positions that follow the cache (the first
    # layer's keys depend on the token and its position only)
    partial = KVCache.empty(network.n_layers)
    network(ids[:, :4], cache=partial, commit=2)
    network(ids[:, 2:5], cache=partial, commit=3)
    alone = KVCache.empty(network.n_layers)
    network(ids[:, :5], cache=alone, commit=5)
    assert partial.length == 5
    torch.testing.assert_close(partial.keys[0], alone.keys[0], atol=1e-6, rtol=0)


# -- Dream's own sampler -------------------------------------------------------------------------------------


def generate_cases() -> list[dict]:
    path = REFERENCE / "dream" / "diffusion_generate.json"
    return json.loads(path.read_text()) if path.is_file() else []


@pytest.mark.parametrize("case", generate_cases(), ids=lambda c: f"{c['alg']}-{c['steps']}-pad{int(c['left_padding'])}")
@torch.no_grad()
def test_dream_presets_reproduce_diffusion_generate(case: dict) -> None:
    network = load_diffusion_lm(REFERENCE / "dream", "dream")
    overrides = [f"sampler=dream_{case['alg']}", f"sampler.steps={case['steps']}", f"sampler.eps={case['eps']}"]
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", *overrides]).sampler, "sampler")
    assert case["temperature"] == 0.0
    prompt = torch.tensor(case["prompt"])
    rows, new = prompt.shape[0], case["max_new_tokens"]
    tokens = torch.cat([prompt, torch.full((rows, new), network.mask_id)], 1)
    keep = None
    if case["attention_mask"] is not None:  # left padding: the padded positions keep their (masked) tokens
        keep = torch.cat([torch.tensor(case["attention_mask"]).bool(), torch.ones(rows, new, dtype=torch.bool)], 1)
    counter = ForwardCounter(network, rows)
    out = sampler.sample(counter, tokens, network.mask_id, torch.Generator().manual_seed(0), attention_mask=keep)
    assert out.tokens.tolist() == case["sequences"]
    assert counter.nfe.tolist() == [case["steps"]] * rows  # a step that reveals nothing still runs


# -- checkpoint directories as users have them ---------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_directory_loads_with_its_tokenizer_and_generates(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from mdmkit.evaluation.generation import TextModel, generate
    from mdmkit.evaluation.text_eval import HFModelConfig, load_text_model

    directory = native_checkpoint_dir(REFERENCE / kind, kind, tmp_path / kind)
    model = load_text_model(str(directory), HFModelConfig(kind=kind), "cpu")
    network, tokenizer = model.network, model.tokenizer
    assert isinstance(network, DiffusionLM) and network.mask_id == 1023
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 1000
    # LLaDA's tokenizer declares no mask token (the config's id is used); Dream's declares <|mask|>
    assert tokenizer.mask_token_id == (None if kind == "llada" else 1023)
    assert tokenizer.convert_tokens_to_ids(MASK_TOKEN[kind]) == 1023
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert all(token in chat for token in CHAT_TOKENS[kind][-2:])
    preset = ["sampler=llada", "sampler.block_length=4"] if kind == "llada" else ["sampler=dream_entropy"]
    sampler = build(compose_config("evaluate", ["ckpt=x.pt", *preset, "sampler.steps=4"]).sampler, "sampler")
    made = generate(TextModel(network, tokenizer), ["What is 2 + 2?", "Say hi."], sampler, 8, [], chat=True,
                    progress=False)
    assert len(made.texts) == 2 and (made.nfe >= 1).all()


def test_dreams_hub_tokenizer_files_load_without_remote_code(tmp_path: Path) -> None:
    # Dream's hub repository has vocab.json and merges.txt, no tokenizer.json, and a tokenizer_config naming its
    # remote DreamTokenizer. A stand-in vocabulary of the real size (151643 entries) with those configs gives the
    # real special-token ids.
    pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    from mdmkit.models.llm.hf import native_tokenizer

    for file in (REFERENCE / "dream" / "hub_tokenizer").iterdir():
        shutil.copy(file, tmp_path / file.name)
    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"w{i}": i for i in range(len(vocab), 151643)})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = native_tokenizer(tmp_path, "dream")
    assert len(tokenizer) == 151667 and tokenizer.mask_token_id == 151666
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 151643 and tokenizer.bos_token_id == 151665
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644
    assert tokenizer("hi <|mask|>")["input_ids"] == [vocab["h"], vocab["i"], vocab["Ġ"], 151666]


@pytest.mark.parametrize("kind", KINDS)
def test_the_bfloat16_option_reaches_the_network(kind: str, tmp_path: Path) -> None:
    from mdmkit.models.llm.registry import load_model

    directory = native_checkpoint_dir(REFERENCE / kind, kind, tmp_path / kind)
    network, _ = load_model(str(directory), kind, dtype="bfloat16")
    assert network.embed.weight.dtype == torch.bfloat16


# -- one-line errors -------------------------------------------------------------------------------------------


def copy_fixture(kind: str, directory: Path, **config: object) -> Path:
    directory.mkdir()
    shutil.copy(REFERENCE / kind / "model.safetensors", directory / "model.safetensors")
    raw = json.loads((REFERENCE / kind / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, **config}))
    return directory


@pytest.mark.parametrize("kind, field, value", [
    ("llada", "alibi", True), ("llada", "block_type", "sequential"), ("llada", "attention_layer_norm", True),
    ("llada", "include_bias", True), ("dream", "use_sliding_window", True), ("dream", "hidden_act", "gelu"),
    ("dream", "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
])
def test_an_unsupported_config_setting_is_refused_in_one_line(kind: str, field: str, value: object,
                                                              tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{field}=.* is not supported") as caught:
        load_diffusion_lm(copy_fixture(kind, tmp_path / "model", **{field: value}), kind)
    assert "\n" not in str(caught.value)


def test_broken_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    with pytest.raises(CheckpointError, match="no model directory"):
        load_diffusion_lm(tmp_path / "absent", "llada")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_diffusion_lm(tmp_path / "empty", "dream")
    with pytest.raises(CheckpointError, match="'d_model' is missing"):
        load_diffusion_lm(copy_fixture("llada", tmp_path / "fieldless", d_model=None), "llada")
    with pytest.raises(CheckpointError, match="implies"):  # weights of another size
        load_diffusion_lm(copy_fixture("llada", tmp_path / "resized", d_model=32), "llada")
    llada_config = json.loads((REFERENCE / "llada" / "config.json").read_text())
    with pytest.raises(CheckpointError, match="unexpected tensor '.*' for this llada config"):
        load_diffusion_lm(copy_fixture("dream", tmp_path / "confused", **llada_config), "llada")
    truncated = copy_fixture("dream", tmp_path / "truncated")
    tensors = load_file(truncated / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, truncated / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing from the checkpoint, e.g. 'model.layers.1.mlp.up_proj.weight'"):
        load_diffusion_lm(truncated, "dream")
    (truncated / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_diffusion_lm(truncated, "dream")


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_without_a_tokenizer_fails_before_its_weights_are_read(kind: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from mdmkit.models.llm.registry import load_model

    read = []
    monkeypatch.setattr("mdmkit.models.llm.hf.load_diffusion_lm", lambda *args: read.append(args))
    with pytest.raises(CheckpointError, match="cannot load the tokenizer of"):
        load_model(str(copy_fixture(kind, tmp_path / "model")), kind)  # config and weights only
    assert not read


@pytest.mark.parametrize("kind, other", [("llada", "dream"), ("dream", "llada")])
def test_a_checkpoint_loaded_as_the_other_kind_says_which_kind_it_is(kind: str, other: str, tmp_path: Path) -> None:
    from mdmkit.models.llm.registry import load_model

    directory = native_checkpoint_dir(REFERENCE / kind, kind, tmp_path / kind)
    with pytest.raises(CheckpointError, match=f"checkpoint \\(model_type\\), not {other}: .*hf.kind={kind}"):
        load_model(str(directory), other)


def test_a_hub_name_offline_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    from mdmkit.models.llm.registry import load_model

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(CheckpointError, match="cannot fetch mdmkit-tests/no-such-model from the hub") as caught:
        load_model("mdmkit-tests/no-such-model", "dream", local_files_only=True)
    assert "\n" not in str(caught.value)

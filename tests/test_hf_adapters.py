"""Hugging Face adapters on tiny, randomly initialised models built locally (nothing comes from the hub)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny_text_models
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.core.stopping import AnswerBudget, AnyStop, StopCondition
from mdmkit.models.llm.hf import HFMaskedDiffusion, load_causal_lm
from mdmkit.models.llm.registry import load_model
from mdmkit.samplers import (
    DreamStepsSampler,
    EBSampler,
    FactorSampler,
    ForwardCounter,
    NTPDecoder,
    P2Sampler,
    RevealAllSampler,
    StepsSampler,
    ThresholdSampler,
    TopKSampler,
)

SPECIALS = ["[PAD]", "[MASK]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB = SPECIALS + [str(d) for d in range(10)] + ["plus", "minus", "equals", "the", "answer", "is"]
SAMPLERS = [
    TopKSampler(k=2),
    StepsSampler(steps=3),
    DreamStepsSampler(steps=3),
    EBSampler(gamma=0.5),
    ThresholdSampler(tau=0.5),
    FactorSampler(factor=1.0),
    RevealAllSampler(),
    P2Sampler(steps=4),
]


def tiny_tokenizer(with_mask: bool = True):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    backend = Tokenizer(WordLevel({word: i for i, word in enumerate(VOCAB)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    extra = {"mask_token": "[MASK]"} if with_mask else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", **extra
    )


def save_bert(directory: Path, with_mask: bool = True) -> Path:
    return tiny_text_models.save_bert(directory, tiny_tokenizer(with_mask))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(save_bert(tmp_path_factory.mktemp("bert"))))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    directory = tiny_text_models.save_llama(tmp_path_factory.mktemp("llama"), tiny_tokenizer())
    return load_causal_lm(str(directory))


def prompts(tokenizer, texts: list[str], n_masks: int) -> torch.Tensor:
    """Equal-length prompts (no padding) followed by `n_masks` mask tokens."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.mask_token_id] * n_masks
           for text in texts]
    assert len({len(row) for row in ids}) == 1
    return torch.tensor(ids)


def run(sampler, network, tokens: torch.Tensor, mask_id: int, attention_mask: torch.Tensor | None = None):
    counter = ForwardCounter(network, tokens.shape[0])
    out = sampler.sample(counter, tokens, mask_id, torch.Generator().manual_seed(0),
                         attention_mask=attention_mask)
    return out.tokens, counter.nfe


# -- masked LM adapter -----------------------------------------------------------------------------


def test_loaded_bert_is_an_mdmkit_network(bert) -> None:
    network, tokenizer = bert
    assert network.mask_id == tokenizer.mask_token_id == VOCAB.index("[MASK]")
    assert not network.shift and network.num_parameters() > 0
    tokens = prompts(tokenizer, ["1 plus 2 equals"], 3)
    logits = network(tokens)
    assert logits.shape == (1, tokens.shape[1], len(VOCAB)) and logits.dtype == torch.float32
    # an all-True key-padding mask is the same as none
    assert torch.allclose(network(tokens, torch.ones(1, 1, 1, tokens.shape[1], dtype=torch.bool)), logits)


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
def test_every_sampler_runs_through_the_adapter(bert, sampler) -> None:
    network, tokenizer = bert
    mask_id = network.mask_id
    tokens = prompts(tokenizer, ["1 plus 2 equals", "3 minus 1 is", "the answer is 4"], 5)
    filled, nfe = run(sampler, network, tokens, mask_id)
    given = tokens != mask_id
    assert not (filled == mask_id).any()
    assert torch.equal(filled[given], tokens[given])
    assert (nfe >= 1).all() and (nfe <= 5 if not isinstance(sampler, P2Sampler) else nfe == 4).all()
    # temperature 0: each row alone gives the same tokens and the same NFE as in the batch
    for row in range(tokens.shape[0]):
        alone, alone_nfe = run(sampler, network, tokens[row:row + 1], mask_id)
        assert torch.equal(alone[0], filled[row])
        assert alone_nfe.item() == nfe[row].item()


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
def test_left_padded_rows_match_their_unpadded_runs(bert, sampler) -> None:
    # BERT's absolute positions would shift under left padding; the adapter passes position ids counted
    # from each row's first real token, so the padded row sees exactly what it sees alone.
    network, tokenizer = bert
    mask_id, pad_id = network.mask_id, tokenizer.pad_token_id
    short = prompts(tokenizer, ["2 plus 2"], 4)
    long = prompts(tokenizer, ["the answer is 3 minus 1"], 4)
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([torch.cat([torch.full((1, pad), pad_id), short], 1), long])
    keep = batch != pad_id
    filled, nfe = run(sampler, network, batch, mask_id, keep)
    for row, alone_tokens in enumerate([short, long]):
        alone, alone_nfe = run(sampler, network, alone_tokens, mask_id)
        assert torch.equal(filled[row][keep[row]], alone[0])
        assert nfe[row].item() == alone_nfe.item()
    assert (filled[0, :pad] == pad_id).all()


def test_masked_out_padding_does_not_change_outputs(bert) -> None:
    network, tokenizer = bert
    tokens = prompts(tokenizer, ["1 plus 2 equals"], 3)
    keep = torch.ones(1, tokens.shape[1] + 2, dtype=torch.bool)
    keep[:, :2] = False
    with_pad = network(torch.cat([torch.full((1, 2), tokenizer.pad_token_id), tokens], 1), keep[:, None, None])
    with_junk = network(torch.cat([torch.tensor([[7, 9]]), tokens], 1), keep[:, None, None])
    assert torch.allclose(with_pad[:, 2:], with_junk[:, 2:], atol=1e-5)
    assert torch.allclose(with_pad[:, 2:], network(tokens), atol=1e-5)


def test_only_key_padding_masks_convert(bert) -> None:
    network, tokenizer = bert
    tokens = prompts(tokenizer, ["1 plus 2 equals"], 3)
    length = tokens.shape[1]
    with pytest.raises(ValueError, match="key-padding"):
        network(tokens, torch.ones(1, 1, length, length, dtype=torch.bool))


class _ShiftedStub(torch.nn.Module):
    """Hugging Face-like model whose logits at position j put all mass on token (j + 100) % V."""

    vocab = 128

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.seen = attention_mask
        targets = (torch.arange(input_ids.shape[1]) + 100) % self.vocab
        logits = torch.nn.functional.one_hot(targets, self.vocab).float() * 50.0
        return SimpleNamespace(logits=logits.expand(input_ids.shape[0], -1, -1))


def test_shift_realigns_logits_by_one_position() -> None:
    stub = _ShiftedStub()
    network = HFMaskedDiffusion(stub, mask_id=5, shift=True)
    predicted = network(torch.zeros(2, 10, dtype=torch.long)).argmax(-1)
    length = torch.arange(10)
    expected = (length - 1 + 100) % stub.vocab
    expected[0] = 100  # position 0 keeps its own logits
    assert torch.equal(predicted, expected.expand(2, -1))
    keep = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    keep[0, ..., :3] = False
    network(torch.zeros(2, 10, dtype=torch.long), keep)
    assert torch.equal(stub.seen, keep[:, 0, 0].long())  # a key-padding mask goes in as HF's attention_mask
    unshifted = HFMaskedDiffusion(stub, mask_id=5, shift=False)
    assert torch.equal(unshifted(torch.zeros(1, 10, dtype=torch.long)).argmax(-1)[0], (length + 100) % 128)


def test_llada_and_dream_checkpoints_without_a_tokenizer_fail_before_the_weights(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    # LLaDA and Dream load into mdmkit's own network (tests/test_native_llms.py checks it against the hub code);
    # their config and tokenizer are read first, so a directory without them fails in one line before any weight.
    read = []
    monkeypatch.setattr("mdmkit.models.llm.hf.load_diffusion_lm", lambda *args: read.append(args))
    (tmp_path / "model").mkdir()
    for kind in ("llada", "dream"):
        with pytest.raises(CheckpointError, match="no config.json"):  # the tokenizer: test_native_llms.py
            load_model(str(tmp_path / "model"), kind)
    assert not read
    with pytest.raises(ConfigError, match="kind='bert' is not one of .*generic.*llada"):
        load_model(str(tmp_path / "model"), "bert")


# -- causal LM adapter -----------------------------------------------------------------------------


def greedy_without_cache(model, prompt: torch.Tensor, keep: torch.Tensor, steps: int) -> torch.Tensor:
    """Reference: recompute the whole prefix every step."""
    tokens, keep = prompt, keep.bool()
    out = []
    for _ in range(steps):
        logits = model(tokens, keep[:, None, None, :])
        token = logits[:, -1].argmax(-1)
        out.append(token)
        tokens = torch.cat([tokens, token[:, None]], 1)
        keep = torch.cat([keep, torch.ones_like(keep[:, :1])], 1)
    return torch.stack(out, 1)


def left_padded(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(map(len, ids))
    batch = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + row for row in ids])
    keep = torch.tensor([[False] * (width - len(row)) + [True] * len(row) for row in ids])
    return batch, keep


TEXTS = ["1 plus 2 equals", "the answer is", "9 minus 3 minus 2 equals"]


def ntp_generate(model, tokenizer, texts: list[str], steps: int, stop_ids: list[int] | None = None):
    """Greedy NTP through the counter, as the text path runs it: left-aligned prompts of different lengths, then
    masks (an id past the vocabulary), at most `steps` tokens a row. Returns the answers [B, T] (T: the longest;
    after a row's stop token, `pad_id`) and each row's NFE."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    mask = model.vocab_size
    canvas = torch.full((len(ids), max(map(len, ids)) + steps), mask)
    for i, row in enumerate(ids):
        canvas[i, : len(row)] = torch.tensor(row)
    stop = AnyStop(((StopCondition.of(stop_ids),) if stop_ids else ()) + (AnswerBudget(steps),))
    counter = ForwardCounter(model, len(ids))
    out = NTPDecoder().sample(counter, canvas, mask, stop=stop)
    answers = torch.stack([out.tokens[i, len(row): len(row) + steps] for i, row in enumerate(ids)])
    answers = torch.where(answers == mask, tokenizer.pad_token_id, answers)
    return answers[:, : int(counter.nfe.max())], counter.nfe


def test_kv_cache_greedy_equals_recomputed_greedy(llama) -> None:
    model, tokenizer = llama
    assert model.num_parameters() > 0
    batch, keep = left_padded(tokenizer, TEXTS)
    tokens, nfe = ntp_generate(model, tokenizer, TEXTS, 8)
    assert tokens.shape == (3, 8) and (nfe == 8).all()
    assert torch.equal(tokens, greedy_without_cache(model, batch, keep, 8))
    for row, text in enumerate(TEXTS):
        alone, alone_nfe = ntp_generate(model, tokenizer, [text], 8)
        assert torch.equal(alone[0], tokens[row]) and alone_nfe.item() == 8


def test_stop_token_ends_a_row_and_its_nfe(llama) -> None:
    model, tokenizer = llama
    free, _ = ntp_generate(model, tokenizer, TEXTS, 8)
    stop = int(free[0, 2])
    tokens, nfe = ntp_generate(model, tokenizer, TEXTS, 8, stop_ids=[stop])
    for row in range(3):
        hits = (free[row] == stop).nonzero().flatten()
        end = int(hits[0]) + 1 if hits.numel() else 8
        assert nfe[row].item() == end
        assert torch.equal(tokens[row, :end], free[row, :end])
        assert (tokens[row, end:] == tokenizer.pad_token_id).all()
    assert nfe[0].item() <= 3
    assert tokens.shape[1] == int(nfe.max())


# -- errors ----------------------------------------------------------------------------------------


def test_missing_directory_is_a_checkpoint_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError, match="no-such-model"):
        load_model(str(missing))
    with pytest.raises(CheckpointError, match="no-such-model"):
        load_causal_lm(str(missing))


def test_directory_without_a_model_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty"):
        load_model(str(tmp_path / "empty"))


def test_tokenizer_without_mask_token_is_refused(tmp_path: Path) -> None:
    directory = save_bert(tmp_path / "nomask", with_mask=False)
    with pytest.raises(CheckpointError, match="no mask token"):
        load_model(str(directory))

"""Tiny Hugging Face models, built locally: a BERT masked LM and a Llama causal LM on any tokenizer, and
both with a byte-level tokenizer for the text-benchmark tests; and the tiny LLaDA / Dream reference fixtures
as user checkpoint directories (`native_checkpoint_dir`).

The tokenizer encodes any text (code, math, unicode) and keeps special tokens for padding, masking and the
end of text, so prompts from the real benchmark files run through the same code paths as LLaDA or Dream.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[MASK]", "<|endoftext|>"]
CORPUS = [
    "Question: Natalia sold 48 clips in April and half as many in May. How many clips did she sell?",
    "Answer: She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in total. The answer is 72.",
    "def add(a, b):\n    return a + b\n\n\nassert add(1, 2) == 3\n",
    "You are an expert Python programmer, and here is your task: [BEGIN]\n[DONE]\n",
] * 4


def byte_level_tokenizer():
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(CORPUS, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", mask_token="[MASK]",
                                                eos_token="<|endoftext|>")


def save_bert(directory: Path, tokenizer, seed: int = 0, **config) -> Path:
    """A 2-layer BERT masked LM (hidden size 32) on `tokenizer`'s vocabulary, saved with it in `directory`.
    `config` overrides `BertConfig` fields (the default context is 64 positions)."""
    import transformers

    torch.manual_seed(seed)
    settings = {"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 64, "max_position_embeddings": 64}
    transformers.BertForMaskedLM(transformers.BertConfig(**{**settings, **config})).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_llama(directory: Path, tokenizer=None, seed: int = 0, **config) -> Path:
    """A 2-layer Llama causal LM (hidden size 32) saved in `directory`, with `tokenizer` and on its vocabulary
    when one is given (else pass `vocab_size`). `config` overrides `LlamaConfig` fields (the default context
    is 64 positions, with 2 key-value heads)."""
    import transformers

    torch.manual_seed(seed)
    settings = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 2, "max_position_embeddings": 64}
    if tokenizer is not None:
        settings["vocab_size"] = len(tokenizer)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **config})).save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


def save_masked_lm(directory: Path, seed: int = 0) -> Path:
    """A 2-layer BERT masked LM with the byte-level tokenizer (a stand-in for LLaDA / Dream)."""
    return save_bert(directory, byte_level_tokenizer(), seed, max_position_embeddings=4096)


def save_causal_lm(directory: Path, seed: int = 0) -> Path:
    """A 2-layer Llama causal LM with the byte-level tokenizer (the NTP baseline's stand-in)."""
    tokenizer = byte_level_tokenizer()
    return save_llama(directory, tokenizer, seed, max_position_embeddings=4096,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)


# -- the LLaDA / Dream / Fast-dLLM v2 reference fixtures as user checkpoint directories --------------------------------

CHAT_TOKENS = {"llada": ["<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "dream": ["<|im_start|>", "<|im_end|>"], "fast_dllm_v2": ["<|im_start|>", "<|im_end|>"],
               "llada_moe": ["<|role_end|>", "<|startoftext|>", "[CLS]", "[gMASK]"],
               "llada2": ["<|role_end|>", "<|startoftext|>", "[CLS]", "[gMASK]"]}  # (LLaDA2.0's tokenizer for both)
MASK_TOKEN = {"llada": "<|mdm_mask|>", "dream": "<|mask|>", "fast_dllm_v2": "|<MASK>|", "llada_moe": "<|mask|>",
              "llada2": "<|mask|>"}


def native_checkpoint_dir(fixture: Path, kind: str, directory: Path, hub_tokenizer: Path | None = None) -> Path:
    """The reference fixture `fixture` (`reference_models/<kind>`) as a user's checkpoint directory: its
    config and weights, the hub's tokenizer configs (from `hub_tokenizer`, default the fixture's), and a tiny
    byte-level BPE of our own (the real vocabularies are not stored) whose special tokens sit at the fixture's
    ids: end of text 1000 (eos and pad), the chat tokens after it, the mask token 1023."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    directory.mkdir()
    for name in ["config.json", "model.safetensors", "generation_config.json"]:
        shutil.copy(fixture / name, directory / name)
    for file in (hub_tokenizer or fixture / "hub_tokenizer").iterdir():
        shutil.copy(file, directory / file.name)
    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"w{i}": i for i in range(len(vocab), 1000)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    declared = json.loads((directory / "tokenizer_config.json").read_text()).get("added_tokens_decoder", {})
    others = [t["content"] for _, t in sorted(declared.items(), key=lambda item: int(item[0]))]
    first = ["<|endoftext|>", *CHAT_TOKENS[kind]]
    specials = first + [t for t in others if t not in first and t != MASK_TOKEN[kind]]
    specials += [f"<|reserved_{i}|>" for i in range(len(specials), 23)]  # the mask token lands on 1023
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials[:23]])
    backend.add_special_tokens([AddedToken(MASK_TOKEN[kind], special=True, normalized=False)])
    backend.save(str(directory / "tokenizer.json"))
    # the placed tokens at their ids here in the hub config (transformers renumbers those it cannot place)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    placed = {backend.token_to_id(t): t for t in [*specials[:23], MASK_TOKEN[kind]]}
    plain = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    flags = {t["content"]: t for t in declared.values()}
    config["added_tokens_decoder"] = {
        **{key: entry for key, entry in declared.items() if entry["content"] not in placed.values()},
        **{str(i): flags.get(t, {**plain, "content": t}) for i, t in placed.items()}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def sharded_copy(fixture: Path, directory: Path) -> Path:
    """`fixture`'s config and weights in `directory` as a two-shard checkpoint with its safetensors index."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(fixture / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    directory.mkdir(parents=True, exist_ok=True)
    for file, part in shards.items():
        save_file({name: tensors[name] for name in part}, directory / file)
    weight_map = {name: file for file, part in shards.items() for name in part}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(fixture / "config.json", directory / "config.json")
    return directory

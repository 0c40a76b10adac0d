"""Tiny Hugging Face models, built locally: a BERT masked LM and a Llama causal LM on any tokenizer, and
both with a byte-level tokenizer for the text-benchmark tests.

The tokenizer encodes any text (code, math, unicode) and keeps special tokens for padding, masking and the
end of text, so prompts from the real benchmark files run through the same code paths as LLaDA or Dream.
"""

from __future__ import annotations

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

"""A tiny model directory of a kind (LLaDA, Dream, SDAR, DiffusionGemma, ...), made offline, to try fine-tuning and
evaluation on a CPU:

    python -m mdmkit.models.llm.tiny --kind llada --out models/tiny-llada

Random seeded weights at a small shape (the kind's `ExampleModel`), saved in the kind's hub layout (or by
transformers' own classes, for a kind that runs through them) with its config.json, beside a byte-level tokenizer
whose special tokens (end of text as EOS and padding, the chat tokens, the mask token at the config's mask id) and
chat template are the kind's own. It knows nothing until trained;
it loads, fine-tunes and evaluates exactly as the real model's directory does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mdmkit.core.errors import CheckpointError, ConfigError
from mdmkit.models.llm.checkpoints import read_config
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.export import save_hub_checkpoint
from mdmkit.models.llm.hf import load_native
from mdmkit.models.llm.registry import ExampleModel, kind_names, load_model, model_kind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

INIT_STD = 0.02  # the weights' normal init (norms start at one), as the models' own training code initialises them


def example_kinds() -> tuple[str, ...]:
    return kind_names(lambda kind: kind.example is not None)


def _tokenizer(example: ExampleModel) -> PreTrainedTokenizerFast:
    """The 256 bytes, then the kind's special tokens, the mask token last."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token in [*example.specials, example.mask]])
    end = example.specials[0]
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=end, pad_token=end, bos_token=example.bos,
        mask_token=example.mask if example.declare_mask else None, chat_template=example.chat_template,
        clean_up_tokenization_spaces=False)


def make_tiny_model(kind: str, directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny `kind` model directory (config.json, model.safetensors, tokenizer) and check that it loads."""
    record = model_kind(kind, lambda k: k.example is not None, "the kinds with a tiny example model")
    assert record.example is not None
    directory = Path(directory).expanduser()
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"{directory} exists and is not empty: name a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(record.example)
    vocabulary = tokenizer.get_vocab()
    ids = {token: vocabulary[token] for token in [*record.example.specials, record.example.mask]}
    config = record.example.config(len(tokenizer), ids)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(str(directory))
    # the class and template where every transformers release reads them (newer ones save a class of their own and
    # the template beside it)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=record.example.chat_template)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    if record.example.weights is not None:  # a kind that runs through transformers' classes writes its own
        record.example.weights(directory, ids, seed)
        load_model(str(directory), kind)
        return directory
    generator = torch.Generator().manual_seed(seed)
    network = DiffusionLM(read_config(directory, kind))  # the kind's own reading of the config just written
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.normal_(0.0, INIT_STD, generator=generator)
    save_hub_checkpoint(network, directory, kind, source=directory, dtype=torch.float32)
    loaded, _ = load_native(str(directory), kind)
    if loaded.mask_id != ids[record.example.mask]:
        raise CheckpointError(f"{directory}: the mask id {loaded.mask_id} is not the tokenizer's "
                              f"{record.example.mask} ({ids[record.example.mask]})")
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mdmkit.models.llm.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=example_kinds())
    parser.add_argument("--out", required=True, help="a new directory for the model")
    parser.add_argument("--seed", type=int, default=0, help="the weights' random seed")
    args = parser.parse_args(argv)
    try:
        directory = make_tiny_model(args.kind, args.out, args.seed)
    except (ConfigError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    network, _ = load_model(str(directory), args.kind)
    size = sum(p.numel() for p in network.parameters()) / 1e6
    tune = f"sft.model={directory} sft.kind={args.kind}, " if model_kind(args.kind).sft_normalize else ""
    print(f"made: {directory} (a {args.kind} model, {size:.2f}M parameters, random weights; {tune}"
          f"evaluate.py ckpt={directory} hf.kind={args.kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

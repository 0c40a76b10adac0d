"""Text benchmarks (GSM8K, HumanEval, MBPP) on Hugging Face models: load, generate, score, keep every generation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from mdmkit.core.config import require
from mdmkit.evaluation.distributed import SINGLE_PROCESS, Ranks
from mdmkit.evaluation.generation import TextModel, generate
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.evaluation.runner import EvalResult
from mdmkit.models.llm.diffusion_lm import DiffusionLM
from mdmkit.models.llm.lora import load_adapter
from mdmkit.models.llm.registry import load_model
from mdmkit.samplers import Sampler
from mdmkit.tasks.text import TextTask


@runtime_checkable
class SparseNetwork(Protocol):
    """A mixture of experts, which runs only its chosen experts for a token."""

    def active_parameters(self) -> int: ...


def parameter_counts(network: torch.nn.Module) -> dict[str, int]:
    """The network's parameters in all, and those one token's forward uses (`active_per_token`: a mixture of
    experts runs only its chosen experts; the total for any other network), for compute estimates."""
    total = sum(p.numel() for p in network.parameters())
    active = network.active_parameters() if isinstance(network, SparseNetwork) else total
    return {"total": int(total), "active_per_token": int(active)}


def load_text_model(name_or_path: str, config: HFModelConfig, device: str) -> TextModel:
    network, tokenizer = load_model(name_or_path, config.kind, trust_remote_code=config.trust_remote_code,
                                    dtype=config.dtype, device=device)
    if config.adapter is not None:
        load_adapter(network, config.adapter, config.kind, config.adapter_any_base)
    positions = position_limit(network)
    if config.max_length is not None and positions is not None:
        require(config.max_length <= positions, f"hf.max_length={config.max_length} is more than the "
                                                f"{positions} positions of {name_or_path}")
    return TextModel(network, tokenizer, config.max_length or positions)


def position_limit(network: torch.nn.Module) -> int | None:
    """How many positions the network was built for (prompt + generation), where its config says."""
    if isinstance(network, DiffusionLM):
        return network.config.max_positions
    config = getattr(getattr(network, "model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    if "roberta" in str(getattr(config, "model_type", "")):  # its positions start after the padding id
        limit -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return limit


def model_fingerprint(name_or_path: str, adapter: str | None = None) -> str:
    """Identifies the weights in results keys: a directory by its config and file sizes, a hub name by itself; an
    adapter merged in by its directory's files too."""
    digest = hashlib.sha256()
    for source in [name_or_path] if adapter is None else [name_or_path, adapter]:
        path = Path(source).expanduser()
        if path.is_dir():
            config = path / "config.json"
            digest.update(config.read_bytes() if config.is_file() else b"")
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(f"{file.relative_to(path)}:{file.stat().st_size}".encode())
        else:
            digest.update(source.encode())
    return digest.hexdigest()[:16]


def evaluate_text_task(
    model: TextModel,
    task: TextTask,
    sampler: Sampler,
    batch_size: int,
    seed: int,
    generations_file: Path | None = None,
    ranks: Ranks = SINGLE_PROCESS,
) -> EvalResult | None:
    """Generate for every test document, score it, and (optionally) write one JSON line per document.

    Data-parallel (`ranks`): each process generates for its batches; rank 0 scores all of them, writes the file
    and returns the result, the other ranks None."""
    docs = task.docs("test")
    require(len(docs) > 0, f"{task.name}: the test split is empty")
    made = generate(model, task.prompts(), sampler, task.max_gen_len, task.stop_phrases, batch_size=batch_size,
                    seed=seed, chat=task.chat, ranks=ranks)
    if made is None:
        return None
    verdicts = task.score(docs, made.texts)
    if generations_file is not None:
        generations_file.parent.mkdir(parents=True, exist_ok=True)
        rows = ({"doc": doc.get("task_id", i), "correct": verdict.correct, "detail": verdict.detail,
                 "nfe": int(made.nfe[i]), "nfe_to_stop": int(made.nfe_to_stop[i]),
                 "computed_tokens": int(made.computed_tokens[i]), "generation": made.texts[i], "raw": made.raw[i]}
                for i, (doc, verdict) in enumerate(zip(docs, verdicts)))
        with open(generations_file, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    return EvalResult(
        correct=np.array([v.correct for v in verdicts]), nfe=made.nfe, wall_time_s=made.wall_time_s,
        predictions=made.texts, nfe_to_stop=made.nfe_to_stop, answer_tokens=made.answer_tokens,
        computed_tokens=made.computed_tokens, metrics={"prompts_cut": made.prompts_cut}, extra_cost=made.extra_cost,
    )

"""Any Hugging Face causal LM (AutoModelForCausalLM): next-token baselines, decoded by `sampler=ntp` (or SBD)."""

from mdmkit.models.llm.hf import load_causal
from mdmkit.models.llm.registry import ModelKind, register_kind

KIND = register_kind(ModelKind("causal", load_causal, "any transformers causal LM, decoded left to right (sampler=ntp)",
                               attention="causal", decoding="causal"))

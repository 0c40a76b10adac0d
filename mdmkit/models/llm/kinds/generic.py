"""Any Hugging Face masked LM (AutoModelForMaskedLM with a mask token), wrapped so every masked sampler runs on it."""

from mdmkit.models.llm.hf import load_generic
from mdmkit.models.llm.registry import ModelKind, register_kind

KIND = register_kind(ModelKind("generic", load_generic, "any transformers masked LM (AutoModelForMaskedLM)"))

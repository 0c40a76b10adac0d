"""Networks declare how they attend and where their logits sit (`AttentionPattern`); the forward counter reads the
declaration, never an attribute it guesses at, and a network that declares nothing is bidirectional and unshifted."""

from __future__ import annotations

import pytest
import torch
from fakes import random_transformer

from mdmkit.models.denoiser import AttentionPattern
from mdmkit.models.llm.diffusion_lm import DiffusionLM, DiffusionLMConfig
from mdmkit.models.llm.hf import HFCausalLM, HFMaskedDiffusion
from mdmkit.models.speculative import SpeculativeConfig
from mdmkit.samplers import ForwardCounter

SHAPE = {"vocab_size": 50, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "mlp_hidden": 32,
         "mask_id": 49}


@pytest.mark.parametrize("settings, attention, shifted", [
    ({}, "bidirectional", False),  # LLaDA
    ({"shift_logits": True}, "bidirectional", True),  # Dream
    ({"shift_logits": True, "attention_block": 8}, "block_causal", True),  # Fast-dLLM v2
])
def test_the_native_network_declares_its_pattern_and_the_counter_reads_it(settings, attention, shifted) -> None:
    network = DiffusionLM(DiffusionLMConfig(**SHAPE, **settings))
    assert isinstance(network, AttentionPattern)
    assert (network.attention, network.shifted_logits) == (attention, shifted)
    counter = ForwardCounter(network, 1)
    assert (counter.block_causal, counter.shifted_logits) == (attention == "block_causal", shifted)


def test_every_network_class_declares_its_pattern() -> None:
    stub = torch.nn.Linear(1, 1)
    speculative = SpeculativeConfig(vocab_size=4, max_len=8, n_noncausal=1, d_model=16, n_heads=2).build()
    declared = {
        "transformer": random_transformer(8, 8), "speculative": speculative,
        "hf masked": HFMaskedDiffusion(stub, mask_id=0), "hf masked, shifted": HFMaskedDiffusion(stub, 0, shift=True),
        "hf causal": HFCausalLM(stub),
    }
    assert all(isinstance(network, AttentionPattern) for network in declared.values())
    assert {name: (n.attention, n.shifted_logits) for name, n in declared.items()} == {
        "transformer": ("bidirectional", False), "speculative": ("bidirectional", False),
        "hf masked": ("bidirectional", False), "hf masked, shifted": ("bidirectional", True),
        "hf causal": ("causal", False),
    }


def test_a_network_that_declares_nothing_is_bidirectional_and_unshifted() -> None:
    class Plain(torch.nn.Module):
        shift = True  # an attribute of that name declares nothing
        config = DiffusionLMConfig(**SHAPE, attention_block=8)

        def forward(self, tokens: torch.Tensor, **_: object) -> torch.Tensor:
            return torch.zeros(*tokens.shape, 4)

    counter = ForwardCounter(Plain(), 1)
    assert not isinstance(Plain(), AttentionPattern)
    assert not counter.block_causal and not counter.shifted_logits


"""`mdmkit.api`: a preset with fields, a model from its directory, text and token generation with NFE."""

from __future__ import annotations

import pytest
import torch

from mdmkit import api
from mdmkit.core.errors import ConfigError
from mdmkit.samplers import EBSampler, ForwardCounter


def test_a_preset_takes_its_fields_and_refuses_unknown_ones() -> None:
    sampler = api.sampler("eb", gamma=1, ordering="entropy")
    assert sampler == EBSampler(gamma=1.0, ordering="entropy")
    with pytest.raises(ConfigError, match=r"sampler eb: unknown field\(s\) \['gama'\] \(valid: block_length, cache"):
        api.sampler("eb", gama=0.1)
    with pytest.raises(ConfigError, match="gamma=-1 must be >= 0"):
        api.sampler("eb", gamma=-1)
    with pytest.raises(ConfigError, match="sampler=nope: no such option"):
        api.sampler("nope")


def test_generate_returns_texts_and_nfe_as_the_evaluation_does(masked_dir) -> None:
    model = api.load_text_model(str(masked_dir), max_length=64)
    made = api.generate(model, ["def add(a, b):", "x = "], api.sampler("topk", k=2), gen_length=6, progress=False)
    assert len(made.texts) == 2 and made.nfe.tolist() == [3, 3]  # 6 masks, two a step
    assert (made.nfe_to_stop <= made.nfe).all() and made.prompts_cut == 0


def test_fill_on_token_ids_equals_the_sampler_run_by_hand(tiny_checkpoint) -> None:
    from mdmkit.io.checkpoint import TrainedModel

    trained = TrainedModel(tiny_checkpoint)
    network, mask = trained.network(), trained.task.mask_id
    sampler = api.sampler("eb", gamma=0.5)
    filled = api.fill(network, [[1, 2, 3], [4, 5]], sampler, gen_length=5, mask_id=mask)
    canvas = torch.tensor([[1, 2, 3] + [mask] * 5, [0, 4, 5] + [mask] * 5])
    keep = torch.ones_like(canvas, dtype=torch.bool)
    keep[1, 0] = False
    counter = ForwardCounter(network, 2)
    by_hand = sampler.sample(counter, canvas, mask, torch.Generator().manual_seed(0), attention_mask=keep)
    assert torch.equal(filled.tokens, by_hand.tokens) and torch.equal(filled.nfe, counter.nfe)
    assert mask not in filled.tokens.tolist()[0]
    with pytest.raises(ConfigError, match="gen_length=0 must be >= 1"):
        api.fill(network, [[1]], sampler, gen_length=0, mask_id=mask)


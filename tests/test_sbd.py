"""Set Block Decoding: the training layout, exact KV caching, NTP decoding, batching, and bad configs."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, compose_config, run_cli
from fakes import random_transformer
from tiny_text_models import save_llama

from mdmkit.core.config import build
from mdmkit.core.errors import ConfigError
from mdmkit.core.stopping import StopCondition
from mdmkit.objectives.sbd import SBDLoss, causal_mask, sbd_attention_mask, sbd_block_mask
from mdmkit.samplers import EBSampler, ForwardCounter, NTPDecoder, SBDSampler, ThresholdSampler, TopKSampler
from mdmkit.samplers.rules.sbd import _CausalDecodeState

VOCAB, MASK, LENGTH = 12, 11, 20
PROMPTS = [5, 8, 3]


def network(positions: str = "rotary", seed: int = 0) -> torch.nn.Module:
    return random_transformer(VOCAB, LENGTH, seed, positions=positions)


def canvas(prompts: list[int] = PROMPTS, seed: int = 1) -> torch.Tensor:
    tokens = torch.randint(0, MASK, (len(prompts), LENGTH), generator=torch.Generator().manual_seed(seed))
    for row, length in enumerate(prompts):
        tokens[row, length:] = MASK
    return tokens


def decode(sampler, net, tokens: torch.Tensor, stop: StopCondition | None = None):
    counter = ForwardCounter(net, tokens.shape[0])
    out = sampler.sample(counter, tokens, MASK, torch.Generator().manual_seed(0), stop=stop)
    return out, counter


# -- training layout ------------------------------------------------------------------------------
FIGURE_8 = """
1000000000000000
1100000000000000
1110000000000000
1111000000000000
1111100000000000
1111110000000000
1111111000000000
1111111100000000
0000000011110000
0000000011110000
0000000011110000
0000000011110000
1111000000001111
1111000000001111
1111000000001111
1111000000001111
"""


def test_training_mask_is_the_papers_figure_8_for_k_4():
    expected = torch.tensor([[c == "1" for c in line] for line in FIGURE_8.split()])
    assert torch.equal(sbd_attention_mask(8, 4), expected)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_and_the_explicit_mask_give_the_same_logits():
    net = network()
    tokens = canvas([20, 20, 20]).clamp(max=MASK - 1)
    noisy = torch.where(torch.rand(tokens.shape, generator=torch.Generator().manual_seed(2)) < 0.5, MASK, tokens)
    both = torch.cat([tokens, noisy], 1)
    positions = torch.arange(LENGTH).repeat(2)[None].expand(3, -1)
    with torch.no_grad():
        dense = net(both, attn_mask=sbd_attention_mask(LENGTH, 4), positions=positions)
        flex = net(both, attn_mask=sbd_block_mask(LENGTH, 4), positions=positions)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_sbd_loss_is_ntp_plus_masked_prediction_and_the_switch_drops_ntp_gradients():
    net = network().train()
    tokens = canvas([6, 6, 6]).clamp(max=MASK - 1)
    answer = torch.arange(LENGTH)[None].expand(3, -1) >= 6
    full = SBDLoss(block_size=(4, 4))
    loss, parts = full(net, tokens, answer, MASK, torch.Generator().manual_seed(0))
    assert loss.item() == pytest.approx((parts["ntp_ce"] + parts["matp_ce"]).item(), rel=1e-6)
    ablation, parts = SBDLoss(block_size=(4, 4), ntp_term=False)(net, tokens, answer, MASK,
                                                                  torch.Generator().manual_seed(0))
    assert ablation.item() == pytest.approx(parts["matp_ce"].item(), rel=1e-6)


def test_the_training_forward_and_a_cached_block_forward_are_the_same_computation():
    """Noisy block b of the 2L layout sees exactly what an inference block after a cached prefix sees."""
    net, block = network(), 4
    tokens = canvas([20]).clamp(max=MASK - 1)
    noisy = tokens.clone()
    noisy[0, 8:12] = torch.tensor([MASK, tokens[0, 9], MASK, MASK])  # block 2 (positions 8..11)
    positions = torch.arange(LENGTH).repeat(2)[None]
    with torch.no_grad():
        train = net(torch.cat([tokens, noisy], 1), attn_mask=sbd_attention_mask(LENGTH, block),
                    positions=positions)[0, LENGTH + 8: LENGTH + 12]
        state = _CausalDecodeState(ForwardCounter(net, 1), torch.cat([tokens[:, :8], torch.full((1, 12), MASK)], 1),
                                   MASK, use_cache=True)
        _, _, infer = state.forward(torch.tensor([0]), noisy[:, 8:12], torch.ones(1, 4, dtype=torch.bool), True)
    torch.testing.assert_close(infer[0], train, atol=1e-5, rtol=1e-5)


# -- exact caching ------------------------------------------------------------------------------
SAMPLERS = [
    SBDSampler(block_size=4, rule=TopKSampler(k=1)),
    SBDSampler(block_size=4, rule=EBSampler(gamma=2.0)),
    SBDSampler(block_size=3, rule=ThresholdSampler(tau=0.1)),
    SBDSampler(block_size=1, rule=TopKSampler(k=1)),
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: f"k{s.block_size}-{type(s.rule).__name__}")
def test_cached_block_decoding_equals_recomputing_the_prefix(sampler, monkeypatch):
    net, tokens = network(), canvas()
    recorded: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    forward = _CausalDecodeState.forward

    def spy(self, rows, block, valid, commit):
        clean, clean_valid, block_logits = forward(self, rows, block, valid, commit)
        recorded[self.use_cache].append(block_logits)
        return clean, clean_valid, block_logits

    monkeypatch.setattr(_CausalDecodeState, "forward", spy)
    cached, cached_counter = decode(sampler, net, tokens)
    uncached_sampler = type(sampler)(block_size=sampler.block_size, rule=sampler.rule, use_cache=False)
    uncached, uncached_counter = decode(uncached_sampler, net, tokens)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert torch.equal(cached_counter.nfe, uncached_counter.nfe)
    assert len(recorded[True]) == len(recorded[False]) > 0
    for a, b in zip(recorded[True], recorded[False]):  # every forward of every block
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (cached.tokens != MASK).all()


def plain_greedy(net, tokens: torch.Tensor) -> torch.Tensor:
    """Greedy causal decoding written from scratch: recompute everything, argmax of the last position."""
    out = tokens.clone()
    for row in range(out.shape[0]):
        length = int((out[row] != MASK).sum())
        while length < LENGTH:
            prefix = out[row: row + 1, :length]
            logits = net(prefix, attn_mask=causal_mask(length))[0, -1]
            logits[MASK] = float("-inf")
            out[row, length] = logits.argmax()
            length += 1
    return out


@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_ntp_decoding_equals_plain_causal_decoding_with_and_without_the_cache(positions):
    net, tokens = network(positions), canvas()
    with torch.no_grad():
        reference = plain_greedy(net, tokens)
    for use_cache in (True, False):
        out, counter = decode(NTPDecoder(use_cache=use_cache), net, tokens)
        assert torch.equal(out.tokens, reference)
        assert counter.nfe.tolist() == [LENGTH - p for p in PROMPTS]  # one forward per generated token


@pytest.mark.parametrize("sampler", [NTPDecoder(), *SAMPLERS[:2]], ids=lambda s: type(s).__name__)
def test_batched_decoding_equals_one_row_at_a_time(sampler):
    net, tokens = network(), canvas()
    batched, counter = decode(sampler, net, tokens)
    for row in range(tokens.shape[0]):
        alone, alone_counter = decode(sampler, net, tokens[row: row + 1])
        assert torch.equal(alone.tokens[0], batched.tokens[row])
        assert alone_counter.nfe.item() == counter.nfe[row].item()


def test_decoding_stops_at_the_end_token_and_notes_the_stop_point():
    net, tokens = network(), canvas()
    for sampler in (NTPDecoder(), SBDSampler(block_size=4, rule=TopKSampler(k=1))):
        free, _ = decode(sampler, net, tokens)
        end = int(free.tokens[0, PROMPTS[0] + 2])  # a token row 0 generates early
        out, counter = decode(sampler, net, tokens, StopCondition.of([end]))
        assert (counter.nfe_at_stop[0] >= 0) and counter.nfe[0] < LENGTH - PROMPTS[0]
        first_end = int((out.tokens[0, PROMPTS[0]:] == end).nonzero()[0])
        assert (out.tokens[0, PROMPTS[0]: PROMPTS[0] + first_end + 1] != MASK).all()


def test_decoders_refuse_infilling_canvases_and_bad_configs():
    net = network()
    tokens = canvas()
    tokens[0, 1] = MASK  # a mask inside the prompt: not a suffix
    with pytest.raises(ValueError, match="suffix"):
        decode(NTPDecoder(), net, tokens)
    with pytest.raises(ConfigError, match="block_size"):
        SBDSampler(block_size=0)
    with pytest.raises(ConfigError, match="block_size"):
        SBDLoss(block_size=(0, 4))
    with pytest.raises(ConfigError, match="block_length"):
        SBDSampler(rule=EBSampler(gamma=0.1, block_length=4))
    cfg = compose_config("evaluate", ["sampler=sbd", "sampler.rule.gamma=-0.5"])
    with pytest.raises(ConfigError, match="gamma"):
        build(cfg.sampler, "sampler")
    cfg = compose_config("evaluate", ["sampler=sbd", "sampler.block_size=0"])
    with pytest.raises(ConfigError, match="block_size"):
        build(cfg.sampler, "sampler")


@pytest.mark.slow
def test_ntp_then_sbd_fine_tuning_runs_through_train_py(tmp_path):
    common = [*TINY, "task.n_train=300", f"results_file={tmp_path}/rows.jsonl", "eval_limit=8"]
    ntp = run_cli("train.py", "experiment=arithmetic_ntp", *common, f"hydra.run.dir={tmp_path}/ntp", cwd=tmp_path)
    assert ntp.returncode == 0, ntp.stderr[-2000:]
    sbd = run_cli("train.py", "experiment=arithmetic_sbd", f"init_from={tmp_path}/ntp/model.pt", *common,
                  f"hydra.run.dir={tmp_path}/sbd", cwd=tmp_path)
    assert sbd.returncode == 0, sbd.stderr[-2000:]
    assert "[arithmetic] trained" in sbd.stdout
    missing = run_cli("train.py", "experiment=arithmetic_sbd", f"init_from={tmp_path}/none.pt", *common,
                      f"hydra.run.dir={tmp_path}/bad", cwd=tmp_path)
    assert missing.returncode != 0 and "none.pt" in missing.stderr


# -- Hugging Face causal LMs --------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from mdmkit.models.llm.hf import HFCausalSpec

    directory = save_llama(tmp_path_factory.mktemp("llama"), vocab_size=VOCAB, num_key_value_heads=1)
    return HFCausalSpec(path=str(directory), vocab_size=VOCAB, max_len=LENGTH).build().eval()


def test_hf_causal_lm_trains_with_the_sbd_loss(llama):
    tokens = canvas([6, 6, 6]).clamp(max=MASK - 1)
    answer = torch.arange(LENGTH)[None].expand(3, -1) >= 6
    llama.train()
    loss, parts = SBDLoss(block_size=(2, 4), attention="sdpa")(llama, tokens, answer, MASK,
                                                                  torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and {"ntp_ce", "matp_ce"} <= set(parts)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in llama.parameters())
    llama.zero_grad()
    llama.eval()


def test_hf_block_decoding_with_the_cache_equals_recomputing(llama):
    tokens = canvas()
    for sampler in SAMPLERS[:2]:
        cached, counter = decode(sampler, llama, tokens)
        plain = type(sampler)(block_size=sampler.block_size, rule=sampler.rule, use_cache=False)
        uncached, uncached_counter = decode(plain, llama, tokens)
        assert torch.equal(cached.tokens, uncached.tokens)
        assert torch.equal(counter.nfe, uncached_counter.nfe)


def test_hf_ntp_decoding_equals_plain_causal_decoding(llama):
    tokens = canvas()
    with torch.no_grad():
        reference = plain_greedy(llama, tokens)
    for use_cache in (True, False):
        out, counter = decode(NTPDecoder(use_cache=use_cache), llama, tokens)
        assert torch.equal(out.tokens, reference)
        assert counter.nfe.tolist() == [LENGTH - p for p in PROMPTS]

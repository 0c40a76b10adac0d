"""DiffusionGemma at real size in the LLM path benchmark (mode `canvas`): an encoder pass over the prompt that fills
its KV cache, then decoder forwards over a canvas against that cache, the mixture of experts routing every token.

The network is transformers' own (`DiffusionGemmaForBlockDiffusion`, text stack only: the vision tower is cut to a
size that weighs nothing and never runs), behind mdmkit's `diffusion_gemma` kind, built from transformers' config
classes with the text config of google/diffusiongemma-26B-A4B-it (`HUB_TEXT`), seeded random weights made on the
device in the run's dtype by transformers' own initialisation. Its sampler is mdmkit's revisable canvas loop
(`sampler=diffusion_gemma`: EB acceptance, self-conditioning, the temperature schedule, renoising) with the adaptive
stop off and no end-of-text ids, so that every canvas takes exactly `steps` decoder forwards whatever random weights
draw: the benchmark's fixed schedule, `steps` set for the same NFE as the other cases.

`HUB_TEXT` values: hidden 2816, 30 layers (5 sliding : 1 full, the config class's default pattern), 16 heads,
8 key/value heads of 256 on sliding layers (window 1024) and 2 of 512 on full layers, dense MLP 2112 beside 128
experts of 704 with 8 a token, vocabulary 262,144, canvas 256. They are the values that several independent public
projects' copies of its config.json (and of Gemma-4 26B-A4B's text config, which it shares) agree on, and the GGUF
header of its quantized release (30 blocks, width 2816, 16 heads, canvas 256); the rotary settings, the logit soft
cap (30) and the tied embeddings are the config class's defaults, which those copies repeat. At these values the
text stack holds 25.25B parameters, 3.84B of them used per token: the model card's 25.2B and 3.8B.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch

from benchmarks.llm_path import Generation, SyncCounter, canvas, case_record, generate, roofline_seconds
from benchmarks.llm_roofline import Forward
from benchmarks.roofline import Hardware
from mdmkit.models.denoiser import CANVAS
from mdmkit.samplers import EBSampler, RevisableSampler

NAME = "diffusiongemma-26b-a4b"
CANVAS_LENGTH = 256
HUB_TEXT: dict[str, Any] = {  # google/diffusiongemma-26B-A4B-it's text_config (see the module for the sources)
    "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 2, "head_dim": 256,
    "global_head_dim": 512, "sliding_window": 1024, "max_position_embeddings": 262144, "num_experts": 128,
    "top_k_experts": 8, "moe_intermediate_size": 704, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
}
# a vision tower that weighs nothing (text only runs here; the real one, 0.4B parameters, never runs for text)
_VISION = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "position_embedding_size": 64}


def _divisor(count: int, at_most: int) -> int:
    """The largest divisor of `count` not above `at_most` (at least 1)."""
    return next(k for k in range(max(1, min(count, at_most)), 0, -1) if count % k == 0)


def text_values(scale: tuple[int, int] | None = None) -> dict[str, Any]:
    """`HUB_TEXT`, or at a width and depth a CPU can run (`scale`): fewer heads of the same widths, the experts'
    count and routing kept with each expert as much narrower as the network, the layer pattern's first layers with
    the last one full (transformers requires it), the real vocabulary."""
    if scale is None:
        return dict(HUB_TEXT)
    width, layers = scale
    hub, ratio = HUB_TEXT, scale[0] / HUB_TEXT["hidden_size"]
    heads = max(1, int(hub["num_attention_heads"] * ratio))

    def kv_heads(name: str) -> int:  # the same share of the query heads, dividing them
        return _divisor(heads, max(1, hub[name] * heads // hub["num_attention_heads"]))

    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    types[-1] = "full_attention"
    return {**hub, "hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads("num_key_value_heads"),
            "num_global_key_value_heads": kv_heads("num_global_key_value_heads"),
            "intermediate_size": max(1, int(hub["intermediate_size"] * ratio)),
            "moe_intermediate_size": max(1, int(hub["moe_intermediate_size"] * ratio)), "layer_types": types}


def gemma_config(scale: tuple[int, int] | None = None, canvas_length: int = CANVAS_LENGTH) -> Any:
    """The `DiffusionGemmaConfig` of the benchmarked network (real size unless `scale`)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig

    text = DiffusionGemmaTextConfig(**text_values(scale))
    return DiffusionGemmaConfig(text_config=text.to_dict(), vision_config=_VISION, canvas_length=canvas_length)


def random_gemma(config: Any, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """mdmkit's DiffusionGemma network over a `DiffusionGemmaForBlockDiffusion` of `config` with seeded random
    weights (transformers' initialisation) made on `device` in `dtype`; no end-of-text ids, so no row ends early."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from mdmkit.models.llm.kinds.diffusion_gemma import DiffusionGemmaNetwork

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        model = DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)
    return DiffusionGemmaNetwork(model.eval(), eos_ids=(), pad_id=None)


def text_parameters(network: Any) -> tuple[int, int]:
    """(parameters of the text stack, those a token's pass uses: every expert's share but its `top_k_experts`)."""
    model, text = network.model, network.model.config.text_config
    total = sum(p.numel() for name, p in model.named_parameters() if "vision" not in name)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    return total, total - experts + experts * text.top_k_experts // text.num_experts


def fixed_canvas_sampler(steps: int) -> RevisableSampler:
    """The canvas loop at DiffusionGemma's defaults (EB at 0.1, temperature 0.8 to 0.4), `steps` decoder forwards
    a canvas: the adaptive stop off."""
    return RevisableSampler(rule=EBSampler(gamma=0.1, ordering="entropy"), max_steps=steps,
                            stability_threshold=None, confidence_threshold=None)


class CanvasClock:
    """A canvas network as the forward counter sees it, timing each encoder and decoder pass and noting its shape
    (as `llm_path.ForwardClock` does for a `DiffusionLM`)."""

    capabilities = frozenset({CANVAS})

    def __init__(self, network: Any, syncs: SyncCounter | None = None) -> None:
        self.network, self.syncs = network, syncs
        self.canvas, self.mask_id = network.canvas, network.mask_id
        self.cuda = next(network.parameters()).device.type == "cuda"
        self.forwards: list[Forward] = []
        self._events: list[tuple[Any, Any]] = []
        self._encoded = 0

    def open(self, prompt: torch.Tensor, keep: torch.Tensor | None) -> Any:
        self._encoded = 0
        return self.network.open(prompt, keep)

    def _timed(self, forward: Forward, run: Any) -> Any:
        self.forwards.append(forward)
        with self.syncs.inside() if self.syncs is not None else nullcontext():
            if not self.cuda:
                start = time.perf_counter()
                out = run()
                forward.seconds = time.perf_counter() - start
                return out
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = run()
            end.record()
            self._events.append((begin, end))
            return out

    def encode(self, state: Any, tokens: torch.Tensor) -> None:
        self._encoded += tokens.shape[1]
        rows, width = tokens.shape
        self._timed(Forward(rows, width, self._encoded, 0, encoder=True), lambda: self.network.encode(state, tokens))

    def decode(self, state: Any, canvas: torch.Tensor, self_conditioning: torch.Tensor | None,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        length = canvas.shape[1]
        forward = Forward(canvas.shape[0], length, self._encoded + length, length)
        out: torch.Tensor = self._timed(forward, lambda: self.network.decode(state, canvas, self_conditioning, rows))
        return out

    def settle(self) -> None:
        for forward, (begin, end) in zip(self.forwards[len(self.forwards) - len(self._events):], self._events):
            forward.seconds = begin.elapsed_time(end) / 1e3
        self._events.clear()


def text_only(tokens: torch.Tensor, config: Any) -> torch.Tensor:
    """`tokens` with the image ids of `config` (a `DiffusionGemmaConfig`) replaced by 0: the network refuses a
    prompt that holds one, and random prompts of thousands of tokens from its vocabulary often would."""
    ids = [i for i in (config.image_token_id, config.boi_token_id, config.eoi_token_id) if i is not None]
    return torch.where(torch.isin(tokens, torch.tensor(ids, dtype=tokens.dtype)), 0, tokens)


def generate_canvas(network: Any, prompt: int, answer: int, batch: int, steps: int,
                    count_syncs: bool = True) -> Generation:
    """One timed generation of `answer` tokens after `prompt` random ones, `batch` rows, `steps` forwards a canvas."""
    tokens = text_only(canvas(prompt, answer, batch, network.vocab_size, network.mask_id), network.model.config)
    return generate(network, tokens, fixed_canvas_sampler(steps), count_syncs, clock_type=CanvasClock)


def canvas_record(generation: Generation, *, text: Any, element_bytes: int, hardware: Hardware | None,
                  predict: tuple[Any, Hardware] | None = None, **keys: Any) -> dict[str, Any]:
    """`llm_path.case_record` of the decoder's forwards (ms per forward, roofline, tokens/s of the whole
    generation), with the encoder's pass beside them: `encoder_ms`, its roofline, and the loop share net of both."""
    encoder = [f for f in generation.forwards if f.encoder]
    decoder = Generation(generation.seconds, [f for f in generation.forwards if not f.encoder],
                         generation.nfe_per_row, generation.loop_syncs, generation.network_syncs, generation.peak_bytes)
    record = case_record(decoder, config=text, element_bytes=element_bytes, hardware=hardware, predict=predict,
                         **keys)
    record.update(encoder_passes=len(encoder), encoder_ms=1e3 * sum(f.seconds for f in encoder),
                  loop_share=1 - generation.forward_seconds / generation.seconds)
    if hardware is not None:
        record["encoder_roofline_ms"] = 1e3 * roofline_seconds(encoder, text, hardware, element_bytes)
    if predict is not None:  # the bound of the whole generation: the encoder's pass too
        bound = roofline_seconds(generation.forwards, predict[0], predict[1], 2)
        record.update(predicted_encoder_ms=1e3 * roofline_seconds(encoder, *predict, element_bytes=2),
                      predicted_tokens_per_s=keys["batch"] * keys["answer"] / bound)
    return record

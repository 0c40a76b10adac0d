"""mdmkit as an lm-eval model: `mdmkit-lm-eval --model mdmkit --model_args ckpt=...,sampler=eb,gamma=0.1`.

`model_args` (docs/llm.md): `ckpt`, `kind`, `sampler` (a `conf/sampler/` name; default the kind's own,
`ModelKind.default_sampler`: `eb`, `ntp` for a causal kind, `diffusion_gemma` for DiffusionGemma, following the
settings the checkpoint gives itself, `ModelKind.sampler_settings`) and its fields
(a nested sampler's dotted, `rule.tau=0.5`), `dtype`, `trust_remote_code`, `max_length`, `gen_length` (when a
request gives no `max_gen_toks`), `mc_samples`, `seed` and `nfe_file` (one JSON line per request with its NFE).
Importing this module registers it in lm-eval's registry (`mdmkit-lm-eval` registers it by module path:
mdmkit/cli/harness.py).

Data parallel through lm-eval's own mechanism, without `accelerate`: under `torchrun --no-python mdmkit-lm-eval`
each process holds a replica on its local rank's GPU (on a CPU, gloo), lm-eval gives it every N-th document and
its collectives (`all_gather`, `gather_object`, `barrier`) run on `torch.distributed`; rank 0 gets every rank's
metrics, logged samples and NFE records.
"""

from __future__ import annotations

import inspect
import json
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# lm-eval's own models first: its registry loads them only while empty, so one holding mdmkit alone has no `hf`
import lm_eval.models  # noqa: F401
import numpy as np
import torch
import torch.distributed as dist
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from omegaconf import OmegaConf

from mdmkit.core.config import build, option, require, to_container
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import ConfigError
from mdmkit.core.progress import progress_bar
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.evaluation.distributed import init_ranks
from mdmkit.evaluation.generation import TextModel, check_decoder, check_sampler, generate
from mdmkit.evaluation.hf_config import HFModelConfig
from mdmkit.evaluation.lm_eval_nfe import Generation, padding, record, summarize
from mdmkit.evaluation.plan import checkpoint_sampler_fields
from mdmkit.evaluation.text_eval import load_text_model
from mdmkit.models.llm.hf import HFCausalLM, check_model_source
from mdmkit.models.llm.registry import model_kind

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

_MODEL_KEYS = {"kind", "dtype", "trust_remote_code", "max_length", "adapter", "adapter_any_base"}
LM_EVAL_DEFAULT_DEVICE = "cuda:0"  # what lm-eval asks for unless --device says otherwise


def sampler_from_args(name: str, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The sampler config `conf/sampler/<name>.yaml` with `overrides` applied, built and validated.

    A dotted key sets a nested sampler's field (`rule.tau`); a nested sampler given an option name becomes that
    option as its file states (`rule=topk`; swaps apply before the fields under them). lm-eval reads `none` in
    model_args as None: a field whose preset value is a string (`cache=none`) takes it back as the string;
    elsewhere None stays null (`block_length=none`).
    """
    config = option("sampler", name)
    for key, value in sorted(overrides.items(), key=lambda item: item[0].count(".")):
        *parents, field = key.split(".")
        node = config
        for parent in parents:
            require(isinstance(node.get(parent), dict), f"{key}: sampler {name} has no nested sampler '{parent}'")
            node = node[parent]
        current = node.get(field)
        if isinstance(current, dict) and "_target_" in current and isinstance(value, str):
            value = option("sampler", value)
        elif value is None and isinstance(current, str):
            value = "none"
        node[field] = value
    built = OmegaConf.create(config)
    return build(built, "sampler"), to_container(built, resolve=False)


def checked_settings(ckpt: str | None, sampler: str | None, kind: str, batch_size: int | str, gen_length: int,
                     mc_samples: int, extra: dict[str, Any]) -> tuple[HFModelConfig, Any, dict[str, Any], str | None]:
    """What `MdmkitLM` checks before a model loads: the model settings, the sampler and its fields (`extra`, the
    model keys taken out of it), the sampler's kind against the model's, a local `ckpt` path. With no sampler named,
    the kind's default follows the settings the checkpoint gives itself, under `extra`'s; the last item is the line
    that says so (`checkpoint_sampler_fields`)."""
    require(ckpt is not None, "model_args needs ckpt=<Hugging Face model directory or hub name>")
    require(isinstance(batch_size, int) or str(batch_size).isdigit(),
            f"batch_size={batch_size}: give a number (auto is not supported)")
    require(mc_samples >= 1, f"mc_samples={mc_samples} must be >= 1")
    require(gen_length >= 1, f"gen_length={gen_length} must be >= 1")
    config = HFModelConfig(kind=kind, **{k: extra.pop(k) for k in list(extra) if k in _MODEL_KEYS})
    record = model_kind(config.kind)
    check_model_source(str(ckpt))
    fields: dict[str, Any] = {}
    name, note = sampler or record.default_sampler, None
    if name == record.default_sampler:
        fields, note = checkpoint_sampler_fields(record, str(ckpt), given=None if sampler else extra)
    built, sampler_config = sampler_from_args(name, {**fields, **extra})
    check_decoder(record.decoding == "causal", built)
    return config, built, sampler_config, note


def check_model_args(text: str) -> None:
    """`--model_args` of `--model mdmkit`, checked as the model will check them, before lm-eval indexes its
    tasks (seconds): a bad value is one line at once."""
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(text)
    settings = inspect.signature(MdmkitLM.__init__).parameters
    extra = {k: v for k, v in args.items() if k not in settings}
    defaults = {name: p.default for name, p in settings.items() if p.default is not inspect.Parameter.empty}
    given = {**defaults, **{k: v for k, v in args.items() if k in settings}}
    checked_settings(given["ckpt"], given["sampler"], given["kind"], given["batch_size"], given["gen_length"],
                     given["mc_samples"], extra)


def _device(device: str | None) -> str:
    """lm-eval's own default, cuda:0, is read as auto (the CPU where there is no GPU, with a note); any other
    device this machine lacks is one line (resolve_device)."""
    if device == LM_EVAL_DEFAULT_DEVICE and not torch.cuda.is_available():
        print(f"[mdmkit] device={device} (lm-eval's default) is not available here; running on cpu")
        return "cpu"
    return str(resolve_device(str(device or "auto")))


@torch.no_grad()
def masked_elbo(network: torch.nn.Module, mask_id: int, context: list[int], continuation: list[int],
                samples: int, generator: torch.Generator) -> float:
    """Monte-Carlo ELBO of log p(continuation | context) for a masked diffusion model.

    Each sample draws a count l ~ U{1..C} of the C continuation tokens, masks l of them uniformly, and scores
    (C / l) * sum of log p(true token) over the masked ones; the mean over samples estimates the bound
    E_l E_mask [C/l sum log p], the lower-variance form of the 1/t-weighted ELBO (LLaDA, Nie et al. 2025).
    """
    device = next(network.parameters()).device
    total = len(continuation)
    sequence = torch.tensor(context + continuation, device=device)
    start = len(context)
    counts = torch.randint(1, total + 1, (samples,), generator=generator, device=generator.device).to(device)
    scores = torch.rand(samples, total, generator=generator, device=generator.device).to(device)
    ranks = scores.argsort(1).argsort(1)
    hidden = ranks < counts[:, None]  # exactly l random continuation positions per sample
    batch = sequence.repeat(samples, 1)
    batch[:, start:] = torch.where(hidden, mask_id, batch[:, start:])
    logp = torch.log_softmax(network(batch)[:, start:].float(), -1)
    target = logp.gather(-1, sequence[start:].expand(samples, -1)[..., None])[..., 0]
    per_sample = (target * hidden).sum(1) * total / counts
    return float(per_sample.mean())


@register_model("mdmkit")
class MdmkitLM(LM):
    def __init__(self, ckpt: str | None = None, sampler: str | None = None, kind: str = "generic",
                 device: str = "auto", batch_size: int | str = 8, max_batch_size: int | None = None,
                 gen_length: int = 256, mc_samples: int = 32, seed: int = 0, nfe_file: str | None = None,
                 **extra: Any) -> None:
        super().__init__()
        config, self.sampler, self.sampler_config, note = checked_settings(ckpt, sampler, kind, batch_size,
                                                                           gen_length, mc_samples, extra)
        device = _device(device)
        self.ranks = init_ranks("cuda" if device.startswith("cuda") else device)  # rank 0 of 1 without a launcher
        self._rank, self._world_size = self.ranks.rank, self.ranks.world_size
        if note and self._rank == 0:
            print(note)
        if self._world_size > 1 and device.startswith("cuda"):
            device = f"cuda:{torch.cuda.current_device()}"  # this rank's GPU (its local rank), whatever was asked
        self._device = torch.device(device)
        self.model: TextModel = load_text_model(str(ckpt), config, device)
        check_sampler(self.model, self.sampler)
        self.batch_size_per_call = int(batch_size)
        self.gen_length, self.mc_samples, self.seed = gen_length, mc_samples, seed
        self.nfe_file = Path(nfe_file) if nfe_file else None
        self.nfe_records: list[dict[str, Any]] = []  # this rank's generations
        self.all_nfe_records: list[dict[str, Any]] | None = None  # every rank's, on rank 0 once gathered
        self._reported = 0

    # -- generation ----------------------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Batches requests that share generation settings; each result is cut at its `until` strings and
        carries its NFE (a `Generation`). lm-eval's padding requests (data parallel) reuse their original's."""
        pad = padding(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            if not pad[i]:
                groups.setdefault(json.dumps(self._settings(request.args[1]), sort_keys=True), []).append(i)
        outputs: list[str] = [""] * len(requests)
        for key, indices in groups.items():
            settings = json.loads(key)
            prompts = [requests[i].args[0] for i in indices]
            made = generate(self.model, prompts, self.sampler, settings["max_gen_toks"], settings["until"],
                            batch_size=self.batch_size_per_call, seed=self.seed,
                            progress=not disable_tqdm and self.rank == 0)
            assert made is not None, "one process's generations"
            for j, i in enumerate(indices):
                outputs[i] = answer = Generation(made.texts[j], made.nfe[j], made.nfe_to_stop[j])
                self.nfe_records.append(record(requests[i], answer, self.sampler_config))
        first = {id(request): i for i, request in reversed(list(enumerate(requests)))}
        for i in (i for i, flag in enumerate(pad) if flag):
            outputs[i] = outputs[first[id(requests[i])]]
        if self.world_size == 1:
            self._report(self.nfe_records)
        return outputs

    def _settings(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)  # `generate` also stops at the end token
        if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature", 0.0) or 0.0) > 0:
            raise ConfigError("request asks for sampling (do_sample/temperature): set it through the sampler's "
                              "temperature in model_args instead")
        return {"until": until, "max_gen_toks": int(gen_kwargs.get("max_gen_toks", self.gen_length))}

    def _report(self, records: list[dict[str, Any]]) -> None:
        """The NFE line on stdout and `nfe_file`, once per new set of records (rank 0 under data parallelism)."""
        if not records or len(records) == self._reported:
            return
        self._reported = len(records)
        nfe = np.array([r["nfe"] for r in records])
        to_stop = np.array([r["nfe_to_stop"] for r in records])
        ranks = f" on {self.world_size} ranks" if self.world_size > 1 else ""
        print(f"[mdmkit] {len(nfe)} generations{ranks}: NFE mean {nfe.mean():.2f}, to the stop point "
              f"{to_stop.mean():.2f}", flush=True)
        if self.nfe_file is not None:
            self.nfe_file.parent.mkdir(parents=True, exist_ok=True)
            self.nfe_file.write_text("".join(json.dumps(r) + "\n" for r in records))

    def get_model_info(self) -> dict[str, Any]:
        """Added by `simple_evaluate` to the results' `config`: the sampler and each task's NFE summary."""
        records = self.nfe_records if self.all_nfe_records is None else self.all_nfe_records
        return {"mdmkit": {"sampler": self.sampler_config, "world_size": self.world_size,
                           "nfe": summarize(records)}}

    # -- chat (--apply_chat_template) ----------------------------------------------------------
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt in the tokenizer's chat template, as evaluate.py's `task.chat=true` makes it (there the shots
        share the question's user message: `--fewshot_as_multiturn false`)."""
        return self.model.chat(chat_history, add_generation_prompt)

    @property
    def tokenizer_name(self) -> str:
        """What lm-eval keys chat-templated requests by (its cache), and records."""
        return str(getattr(self.model.tokenizer, "name_or_path", "")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The template lm-eval records in its results' config."""
        template = getattr(self.model.tokenizer, "chat_template", None)
        return template if chat_template and isinstance(template, str) else None

    # -- data parallel (lm-eval's collectives) -------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor`, concatenated in rank order (0-d tensors stacked), as accelerate's `gather`."""
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's `obj` on `dst` (None elsewhere). This rank's NFE records travel with it, so rank 0 holds
        them all after lm-eval's gathers of samples and metrics, without a collective of mdmkit's own."""
        if self.world_size == 1:
            return [obj]
        gathered: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        dist.gather_object((obj, self.nfe_records), gathered, dst=dst)
        if gathered is None:
            return None
        self.all_nfe_records = [line for _, lines in gathered for line in lines]
        self._report(self.all_nfe_records)
        return [part for part, _ in gathered]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # -- likelihoods ---------------------------------------------------------------------------
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log p, is_greedy): exact for causal models; for masked ones a Monte-Carlo ELBO, never greedy."""
        tokenizer, network = self.model.tokenizer, self.model.network
        results = []
        for request in progress_bar(requests, disable=disable_tqdm or self.rank != 0, desc="loglikelihood"):
            context, continuation = request.args
            # a stream of its own per request: the estimate does not depend on which rank, or after what, it runs
            generator = seeded_generator(stream_seed(self.seed, zlib.crc32(f"{context}\0{continuation}".encode())))
            whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
            head = tokenizer(context, add_special_tokens=False)["input_ids"]
            split = len(head) if whole[: len(head)] == head else len(whole) - len(
                tokenizer(continuation, add_special_tokens=False)["input_ids"])
            context_ids, continuation_ids = whole[:split], whole[split:]
            require(len(continuation_ids) > 0, "loglikelihood needs a non-empty continuation")
            if isinstance(network, HFCausalLM):
                results.append(self._causal_loglikelihood(context_ids, continuation_ids))
            else:
                score = masked_elbo(network, self.model.mask_id_for(self.sampler), context_ids, continuation_ids,
                                    self.mc_samples, generator)
                results.append((score, False))
        return results

    @torch.no_grad()
    def _causal_loglikelihood(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        device = next(self.model.network.parameters()).device
        sequence = torch.tensor([(context or [self.model.pad_id]) + continuation], device=device)
        logits = self.model.network(sequence)[0, -len(continuation) - 1: -1].float()
        logp = torch.log_softmax(logits, -1)
        target = torch.tensor(continuation, device=device)
        greedy = bool((logits.argmax(-1) == target).all())
        return float(logp.gather(-1, target[:, None]).sum()), greedy

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            "mdmkit: loglikelihood_rolling (perplexity tasks) is not implemented: a masked diffusion model has "
            "no left-to-right factorisation to roll over; use generation tasks or loglikelihood (ELBO) tasks")

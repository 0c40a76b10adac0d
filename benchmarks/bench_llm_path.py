"""The LLM path at real size on a GPU: tokens/s, ms per forward beside its roofline, peak memory, host syncs.

    python -m benchmarks.bench_llm_path --device cuda --repeats 1 --budget-s 420   # one device call, ~8 minutes
    python -m benchmarks.bench_llm_path --device cuda --models llada-8b --prompts 512 --batches 1 --rules
    python -m benchmarks.bench_llm_path --scale 512,4 --prompts 512 --batches 1 4 --predict H200   # on a CPU
    python -m benchmarks.bench_llm_path --page-only --out docs/results/llm_path_gpu  # re-make from <out>.jsonl

Cases run in order of importance: batch 1 for every model (in the order `--models` names them) and prompt, the
rules' overhead at batch 1, then each larger batch (and the rules at their next batch size). One network is on the
device at a time, made when a case needs it and freed before the next is made (the real sizes, 16-50 GB in bf16
each, do not fit together); a variant (`llm_path.VARIANTS`) reuses its network. Each case is written to
`<out>.jsonl` as soon as it is measured, so a run cut short keeps what it did; `--budget-s` stops starting new cases
once that many seconds have passed. A case that runs out of memory is recorded as such. See `benchmarks.llm_path`
for the method, `benchmarks.llm_path_canvas` for DiffusionGemma's (mode `canvas`)."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import llm_path_canvas as canvas_path
from benchmarks.llm_path import (
    CARDS,
    MODES,
    PRESETS,
    VARIANTS,
    canvas,
    card_of,
    case_record,
    fixed_sampler,
    generate,
    measured_card,
    network_for,
    own_block,
    random_llm,
    scaled,
)
from benchmarks.llm_path_page import write_llm_path_page
from mdmkit import api
from mdmkit.analysis.pages import Page, command_line, run_script, stamp
from mdmkit.core.config import option
from mdmkit.core.errors import MdmkitError

MODELS = (*PRESETS, *VARIANTS, canvas_path.NAME)


@dataclass
class Model:
    """A benchmarked case: its name, the network it runs (a `PRESETS` name or DiffusionGemma's) and its decoder
    (`masked`: `llm_path.fixed_sampler`'s, `editing`: LLaDA2.1's, `canvas`: DiffusionGemma's)."""

    name: str
    preset: str
    decoder: str

    @classmethod
    def named(cls, name: str) -> Model:
        if name == canvas_path.NAME:
            return cls(name, name, "canvas")
        preset, decoder = VARIANTS.get(name, (name, "masked"))
        return cls(name, preset, decoder)


RULES = ("steps", "topk", "eb", "threshold", "factor", "klass", "credit", "prophet", "dus", "wino")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="in order of importance; block-causal ones (fast-dllm-v2-7b, llada2-mini, sdar-*) run "
                             f"`none` and `block` only, {canvas_path.NAME} `canvas` only")
    parser.add_argument("--prompts", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--answer", type=int, default=256)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--steps-per-block", type=int, default=8, help="forwards per block in every mode")
    parser.add_argument("--canvas-steps", type=int, default=None,
                        help=f"{canvas_path.NAME}'s decoder forwards per canvas (default: the others' NFE)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--repeats", type=int, default=2, help="timed generations per case (the median is kept)")
    parser.add_argument("--rules", nargs="*", default=list(RULES), help="rule presets timed for overhead")
    parser.add_argument("--rule-batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                        help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--scale", default=None, metavar="WIDTH,LAYERS",
                        help="the presets at this width and depth (the real vocabulary), for a CPU run")
    parser.add_argument("--card", default=None, choices=[*CARDS, "measured"],
                        help="roofline figures: a data sheet, or measured here (default: the detected card's data "
                             "sheet, else measured)")
    parser.add_argument("--predict", default=None, choices=list(CARDS),
                        help="also the roofline of each case's forwards at the real size in bf16 on this card")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new case after this many seconds")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None,
                        help="output prefix (default docs/results/llm_path_gpu on a GPU, llm_path_cpu on a CPU)")
    parser.add_argument("--page-only", action="store_true", help="re-make the page from <out>.jsonl and <out>.json")
    parser.add_argument("--note", action="append", default=[], help="a line under the page's notes (repeatable)")
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.out = args.out or Path("docs/results/llm_path_gpu" if gpu else "docs/results/llm_path_cpu")
    if args.scale is not None:
        try:
            width, layers = (int(part) for part in args.scale.split(","))
        except ValueError:
            parser.error(f"--scale {args.scale}: expected WIDTH,LAYERS, e.g. 512,4")
        args.scale = (width, layers)
    return args


def _blocked(rule: str, **fields: Any) -> dict[str, Any]:
    """`fields` for the preset `rule`, or for its base sampler where it wraps one (Prophet)."""
    config = option("sampler", rule)
    if "base" in config and "block_length" not in config:
        return {"base": {**config["base"], **fields}}
    return fields


def _median_case(generations: list, record: Any = case_record, **keys: Any) -> dict[str, Any]:
    records = [record(g, **keys) for g in generations]
    middle = statistics.median_low(r["seconds"] for r in records)
    return next(r for r in records if r["seconds"] == middle)


class Run:
    """The cases of one invocation, each appended to `<out>.jsonl` when measured."""

    def __init__(self, args: argparse.Namespace, page: Page) -> None:
        self.args, self.page = args, page
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype)
        self.hardware = CARDS[args.card] if args.card in CARDS else card_of(self.device)
        if args.card == "measured" or self.hardware is None:
            self.hardware = measured_card(self.device, self.dtype, _device_name(self.device))
            print(f"roofline: {self.hardware.name}", flush=True)
        self.started = time.monotonic()
        self.cases: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self.parameters: dict[str, int] = {}
        self.active: dict[str, int] = {}  # parameters a token's forward uses (a mixture of experts: fewer)
        self.decoding: dict[str, str] = {}  # how each model decodes, where it is not the run's blocks and steps
        self.syncs: dict[tuple, tuple[int, int, int]] = {}  # (model, prompt, mode) -> loop, network, forwards
        self.resident: tuple[str, Any] | None = None  # the network on the device: (preset, network)
        self.counts: dict[str, tuple[int, int]] = {}  # preset -> (parameters, active parameters)
        page.file(".jsonl").write_text("")

    def out_of_time(self) -> bool:
        budget = self.args.budget_s
        return budget is not None and time.monotonic() - self.started > budget

    def keep(self, record: dict[str, Any], into: list) -> None:
        into.append(record)
        with self.page.file(".jsonl").open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items()}
        print(json.dumps(shown), flush=True)

    def real_config(self, model: Model) -> Any:
        """The real-size config of `model`'s network (DiffusionGemma: its text config), for `--predict`."""
        return canvas_path.gemma_config().text_config if model.decoder == "canvas" else PRESETS[model.preset]

    def schedule(self, model: Model) -> tuple[int, int]:
        """(block, forwards per block) of `model`; DiffusionGemma: (canvas length, decoder forwards per canvas)."""
        args = self.args
        if model.decoder != "canvas":
            return own_block(PRESETS[model.preset], args.block, args.steps_per_block)
        length = min(canvas_path.CANVAS_LENGTH, args.answer)
        return length, args.canvas_steps or max(1, length * args.steps_per_block // args.block)

    def network(self, model: Model) -> Any:
        """`model`'s network, made on the device if it is not the one there (which is freed first)."""
        if self.resident is not None and self.resident[0] == model.preset:
            network = self.resident[1]
        else:
            self.resident = None
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            network = self._build(model)
            self.resident = (model.preset, network)
        self.parameters[model.name], self.active[model.name] = self.counts[model.preset]
        if (model.decoder, *self.schedule(model)) != ("masked", self.args.block, self.args.steps_per_block):
            self.decoding.setdefault(model.name, self._decoding(model))
        return network

    def _build(self, model: Model) -> Any:
        scale = self.args.scale
        if model.decoder == "canvas":
            config = canvas_path.gemma_config(scale, self.schedule(model)[0])
            network = canvas_path.random_gemma(config, self.device, self.dtype)
            self.counts[model.preset] = canvas_path.text_parameters(network)
        else:
            config = PRESETS[model.preset] if scale is None else scaled(PRESETS[model.preset], *scale)
            network = random_llm(config, self.device, self.dtype)
            self.counts[model.preset] = (network.num_parameters(), network.active_parameters())
        total, active = self.counts[model.preset]
        print(f"{model.preset}: {total / 1e9:.2f}B parameters ({active / 1e9:.2f}B active per token) on "
              f"{self.device} in {self.args.dtype}", flush=True)
        return network

    def _decoding(self, model: Model) -> str:
        block, steps = self.schedule(model)
        if model.decoder == "canvas":
            return (f"DiffusionGemma's canvas loop (EB, self-conditioning, renoising): canvases of {block}, {steps} "
                    "decoder forwards each (the adaptive stop off), one encoder pass over the prompt and each "
                    "finished canvas (its time beside the decoder's)")
        said = f"blocks of {block}, {steps} forwards a block"
        if model.decoder == "editing":
            said += (" with LLaDA2.1's decoder: M2T reveals, T2T edits at 0.5 and one post step a block; `none` is "
                     "its generate (each forward recomputes the window up to the block's end), `block` its cached "
                     f"form; the forwards have {model.preset}'s shapes, the loop is what differs")
        return said

    def plan(self, models: list[Model]) -> list[tuple[str, Model, int, int]]:
        """(what, model, prompt, batch) in order of importance: each batch size for every model and prompt, the
        rules' overhead (on the first masked-decoding model) at each of their batch sizes as soon as cases at that
        size have run."""
        steps: list[tuple[str, Model, int, int]] = []
        ruled = [model for model in models if model.decoder == "masked"][:1]
        rule_batches = sorted(self.args.rule_batches) if self.args.rules and ruled else []
        for batch in sorted(self.args.batches):
            steps += [("case", model, prompt, batch) for model in models for prompt in self.args.prompts]
            while rule_batches and rule_batches[0] <= batch:
                steps += [("rules", model, self.args.prompts[0], rule_batches.pop(0)) for model in ruled]
        steps += [("rules", ruled[0], self.args.prompts[0], b) for b in rule_batches]
        return steps

    def modes(self, model: Model) -> list[str]:
        return [mode for mode in self.args.modes if (mode == "canvas") == (model.decoder == "canvas")]

    def run(self) -> None:
        models = [Model.named(name) for name in self.args.models]
        missing: set[str] = set()  # models this Python cannot make (a transformers without DiffusionGemma)
        for what, model, prompt, batch in self.plan(models):
            if self.out_of_time():
                print(f"--budget-s {self.args.budget_s:g} spent: the remaining cases are not run", flush=True)
                return
            if model.name in missing:
                continue
            try:
                self.network(model)
            except ImportError as error:
                missing.add(model.name)
                self.keep({"model": model.name, "prompt": prompt, "answer": self.args.answer, "batch": batch,
                           "mode": self.modes(model)[0] if self.modes(model) else "none",
                           "error": f"cannot be made here: {str(error).splitlines()[0][:100]}"}, self.cases)
                continue
            if what == "rules":
                self.rule_overheads(model, prompt, batch)
                continue
            if not any((model.name, prompt, mode) in self.syncs for mode in self.modes(model)):
                self.warm_up(model, prompt)
            for mode in self.modes(model):
                self.case(model, prompt, batch, mode)

    def _generate(self, model: Model, network: Any, prompt: int, batch: int, mode: str, count_syncs: bool) -> Any:
        block, steps = self.schedule(model)
        if model.decoder == "canvas":
            return canvas_path.generate_canvas(network, prompt, self.args.answer, batch, steps, count_syncs)
        return generate(network, self._canvas(network, prompt, batch),
                        fixed_sampler(mode, steps, block, model.decoder), count_syncs)

    def _network_for(self, model: Model, mode: str) -> Any:
        network = self.network(model)
        return network if model.decoder == "canvas" else network_for(network, mode, self.schedule(model)[0])

    def warm_up(self, model: Model, prompt: int) -> None:
        """One generation per mode at batch 1 (kernels chosen, caches allocated), counting host syncs."""
        for mode in self.modes(model):
            network = self._network_for(model, mode)
            if network is not None:
                warm = self._generate(model, network, prompt, 1, mode, count_syncs=True)
                decoded = sum(not forward.encoder for forward in warm.forwards)  # a canvas network: its decoder's
                self.syncs[model.name, prompt, mode] = (warm.loop_syncs, warm.network_syncs, decoded)

    def _canvas(self, network: Any, prompt: int, batch: int, answer: int | None = None) -> torch.Tensor:
        return canvas(prompt, answer or self.args.answer, batch, network.vocab_size, network.mask_id)

    def case(self, model: Model, prompt: int, batch: int, mode: str) -> None:
        network = self._network_for(model, mode)
        if network is None:
            return
        keys = {"model": model.name, "prompt": prompt, "answer": self.args.answer, "batch": batch, "mode": mode}
        try:
            runs = [self._generate(model, network, prompt, batch, mode, count_syncs=False)
                    for _ in range(self.args.repeats)]
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            self.keep({**keys, "error": "out of memory"}, self.cases)
            return
        predict = None if self.args.predict is None else (self.real_config(model), CARDS[self.args.predict])
        element_bytes = torch.finfo(self.dtype).bits // 8
        if model.decoder == "canvas":
            record = _median_case(runs, canvas_path.canvas_record, text=network.model.config.text_config,
                                  element_bytes=element_bytes, hardware=self.hardware, predict=predict, **keys)
        else:
            record = _median_case(runs, config=network.config, element_bytes=element_bytes, hardware=self.hardware,
                                  predict=predict, **keys)
        loop, inside, forwards = self.syncs[model.name, prompt, mode]
        record.update(loop_syncs_per_forward=loop / forwards, network_syncs_per_forward=inside / forwards)
        self.keep(record, self.cases)

    def rule_overheads(self, model: Model, prompt: int, batch: int) -> None:
        """Each rule's loop share over one block of answer, at `batch` (cache dual where the rule takes it)."""
        network = self.network(model)
        tokens = self._canvas(network, prompt, batch, answer=self.args.block)
        for rule in self.args.rules:
            if self.out_of_time():
                return
            keys = {"model": model.name, "rule": rule, "batch": batch, "cache": "dual"}
            try:
                try:
                    sampler = api.sampler(rule, **_blocked(rule, block_length=self.args.block, cache="dual"))
                except MdmkitError:  # a rule that runs full forwards only (WINO's shadow block, ...)
                    sampler = api.sampler(rule, **_blocked(rule, block_length=self.args.block))
                    keys["cache"] = "none"
                generate(network, tokens, sampler, count_syncs=False)  # warm-up
                counted = generate(network, tokens, sampler)
                timed = generate(network, tokens, sampler, count_syncs=False)
            except (MdmkitError, torch.cuda.OutOfMemoryError) as error:
                self.keep({**keys, "error": str(error).splitlines()[0][:120]}, self.rules)
                continue
            self.keep({**keys, "forwards": len(timed.forwards), "loop_share": 1 - timed.forward_seconds / timed.seconds,
                       "loop_syncs_per_forward": counted.loop_syncs / len(counted.forwards)}, self.rules)

    def record(self, command: str) -> dict[str, Any]:
        setup = {k: v for k, v in vars(self.args).items() if k not in ("out", "note", "page_only")}
        return {"command": command, **stamp(), "device": _device_name(self.device),
                "hardware": None if self.hardware is None else self.hardware.name,
                "hardware_figures": None if self.hardware is None else asdict(self.hardware),
                "threads": torch.get_num_threads(), "parameters": self.parameters,
                "active_parameters": self.active, "decoding": self.decoding, "setup": setup,
                "notes": self.args.note}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    page = Page(args.out)
    if args.page_only:
        record = json.loads(page.file(".json").read_text())
        rows = [json.loads(line) for line in page.file(".jsonl").read_text().splitlines() if line.strip()]
        cases, rules = [r for r in rows if "mode" in r], [r for r in rows if "rule" in r]
        record = {k: v for k, v in record.items() if k not in ("cases", "rules")}
        print("wrote " + ", ".join(map(str, write_llm_path_page(page, record, cases, rules))))
        return
    run = Run(args, page)
    torch.set_grad_enabled(False)
    run.run()
    record = run.record(command_line(__file__, argv))
    print("wrote " + ", ".join(map(str, write_llm_path_page(page, record, run.cases, run.rules))))


if __name__ == "__main__":
    run_script(main, "bench_llm_path")

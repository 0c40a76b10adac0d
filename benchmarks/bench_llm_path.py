"""The LLM path at real size on a GPU: tokens/s, ms per forward beside its roofline, peak memory, host syncs.

    python -m benchmarks.bench_llm_path --device cuda --repeats 1 --budget-s 420   # one device call, ~8 minutes
    python -m benchmarks.bench_llm_path --device cuda --models llada-8b --prompts 512 --batches 1 --rules
    python -m benchmarks.bench_llm_path --scale 512,4 --prompts 512 --batches 1 4 --predict H200   # on a CPU
    python -m benchmarks.bench_llm_path --page-only --out docs/results/llm_path_gpu  # re-make from <out>.jsonl

Both networks are built first (31 GB in bf16), then cases run in order of importance: batch 1 for every model and
prompt, the rules' overhead at batch 1, then each larger batch (and the rules at their next batch size). Each case
is written to `<out>.jsonl` as soon as it is measured, so a run cut short keeps what it did; `--budget-s` stops
starting new cases once that many seconds have passed. A case that runs out of memory is recorded as such. See
`benchmarks.llm_path` for the method."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.llm_path import (
    CARDS,
    MODES,
    PRESETS,
    canvas,
    card_of,
    case_record,
    fixed_sampler,
    generate,
    measured_card,
    network_for,
    random_llm,
    scaled,
)
from benchmarks.llm_path_page import write_llm_path_page
from mdmkit import api
from mdmkit.analysis.pages import Page, command_line, run_script, stamp
from mdmkit.core.config import option
from mdmkit.core.errors import MdmkitError
from mdmkit.models.llm.diffusion_lm import DiffusionLM


@dataclass
class Model:
    """A benchmarked network and its name."""

    name: str
    network: DiffusionLM


RULES = ("steps", "topk", "eb", "threshold", "factor", "klass", "credit", "prophet", "dus", "wino")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(PRESETS), choices=list(PRESETS),
                        help="block-causal ones (fast-dllm-v2-7b, llada2-mini) run `none` and `block` only")
    parser.add_argument("--prompts", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--answer", type=int, default=256)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--steps-per-block", type=int, default=8, help="forwards per block in every mode")
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


def _median_case(generations: list, **keys: Any) -> dict[str, Any]:
    records = [case_record(g, **keys) for g in generations]
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
        self.syncs: dict[tuple, tuple[int, int, int]] = {}  # (model, prompt, mode) -> loop, network, forwards
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

    def build(self, name: str) -> Model:
        config = PRESETS[name] if self.args.scale is None else scaled(PRESETS[name], *self.args.scale)
        model = Model(name, random_llm(config, self.device, self.dtype))
        self.parameters[name] = model.network.num_parameters()
        self.active[name] = model.network.active_parameters()
        print(f"{name}: {self.parameters[name] / 1e9:.2f}B parameters ({self.active[name] / 1e9:.2f}B active per "
              f"token) on {self.device} in {self.args.dtype}", flush=True)
        return model

    def plan(self, models: list[Model]) -> list[tuple[str, Model, int, int]]:
        """(what, model, prompt, batch) in order of importance: each batch size for every model and prompt, the
        rules' overhead at each of their batch sizes as soon as cases at that size have run."""
        steps: list[tuple[str, Model, int, int]] = []
        rule_batches = sorted(self.args.rule_batches) if self.args.rules else []
        for batch in sorted(self.args.batches):
            steps += [("case", model, prompt, batch) for model in models for prompt in self.args.prompts]
            while rule_batches and rule_batches[0] <= batch:
                steps += [("rules", model, self.args.prompts[0], rule_batches.pop(0)) for model in models[:1]]
        steps += [("rules", models[0], self.args.prompts[0], b) for b in rule_batches]
        return steps

    def run(self) -> None:
        models = [self.build(name) for name in self.args.models]
        for what, model, prompt, batch in self.plan(models):
            if self.out_of_time():
                print(f"--budget-s {self.args.budget_s:g} spent: the remaining cases are not run", flush=True)
                return
            if what == "rules":
                self.rule_overheads(model, prompt, batch)
                continue
            if not any((model.name, prompt, mode) in self.syncs for mode in self.args.modes):
                self.warm_up(model, prompt)
            for mode in self.args.modes:
                self.case(model, prompt, batch, mode)

    def warm_up(self, model: Model, prompt: int) -> None:
        """One generation per mode at batch 1 (kernels chosen, caches allocated), counting host syncs."""
        for mode in self.args.modes:
            network = network_for(model.network, mode, self.args.block)
            if network is not None:
                warm = generate(network, self._canvas(network, prompt, 1), self._sampler(mode))
                self.syncs[model.name, prompt, mode] = (warm.loop_syncs, warm.network_syncs, len(warm.forwards))

    def _canvas(self, network: Any, prompt: int, batch: int, answer: int | None = None) -> torch.Tensor:
        return canvas(prompt, answer or self.args.answer, batch, network.vocab_size, network.mask_id)

    def _sampler(self, mode: str) -> Any:
        return fixed_sampler(mode, self.args.steps_per_block, self.args.block)

    def case(self, model: Model, prompt: int, batch: int, mode: str) -> None:
        network = network_for(model.network, mode, self.args.block)
        if network is None:
            return
        keys = {"model": model.name, "prompt": prompt, "answer": self.args.answer, "batch": batch, "mode": mode}
        try:
            runs = [generate(network, self._canvas(network, prompt, batch), self._sampler(mode), count_syncs=False)
                    for _ in range(self.args.repeats)]
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            self.keep({**keys, "error": "out of memory"}, self.cases)
            return
        predict = None if self.args.predict is None else (PRESETS[model.name], CARDS[self.args.predict])
        record = _median_case(runs, config=network.config, element_bytes=torch.finfo(self.dtype).bits // 8,
                              hardware=self.hardware, predict=predict, **keys)
        loop, inside, forwards = self.syncs[model.name, prompt, mode]
        record.update(loop_syncs_per_forward=loop / forwards, network_syncs_per_forward=inside / forwards)
        self.keep(record, self.cases)

    def rule_overheads(self, model: Model, prompt: int, batch: int) -> None:
        """Each rule's loop share over one block of answer, at `batch` (cache dual where the rule takes it)."""
        network = model.network
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
                "active_parameters": self.active, "setup": setup,
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

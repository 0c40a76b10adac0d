"""The training step's parts that a device leg's speed rests on: the fused EMA update, the compiled training
network, and the throughput bench (benchmarks/bench_train_step.py) that measures them."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_config
from torch import nn

from benchmarks.train_throughput import time_training_steps
from mdmkit.core.config import to_container
from mdmkit.io.checkpoint import build_task
from mdmkit.training.ema import EMA
from mdmkit.training.module import MDMModule


def test_ema_update_is_the_decayed_average_of_every_parameter() -> None:
    network = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    ema = EMA(network, decay=0.9)
    start = {name: p.detach().clone() for name, p in network.named_parameters()}
    with torch.no_grad():
        for p in network.parameters():
            p.add_(1.0)
    ema.update(network, step=100)  # warm-up over: decay min(0.9, 101/110) = 0.9
    ema.update(network, step=0)  # warm-up: decay 1/10
    for name, p in network.named_parameters():
        once = 0.9 * start[name] + 0.1 * p.detach()
        expected = 0.1 * once + 0.9 * p.detach()
        torch.testing.assert_close(ema.shadow[name.replace(".", "__")], expected)


def _config(*overrides: str) -> dict:
    return to_container(compose_config("train", [*TINY, *overrides]))


def test_compiled_training_network_stays_out_of_the_state_dict_and_gives_the_eager_loss() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's CPU backend needs a C compiler (cc/gcc), which this machine lacks")
    torch.compiler.reset()
    eager, compiled = MDMModule.from_config(_config()), MDMModule.from_config(_config("compile=true"))
    compiled.network.load_state_dict(eager.network.state_dict())
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints stay loadable either way
    assert compiled.train_network is not compiled.network and eager.train_network is eager.network
    test = compiled.task.load_test()
    losses = []
    for module in (eager, compiled):
        loss, _ = module.objective(module.train_network, test.tokens[:8], test.answer_mask[:8], module.task.mask_id,
                                   torch.Generator().manual_seed(3))
        loss.backward()
        losses.append((loss.detach(), module.network.head.weight.grad.clone()))
    torch.testing.assert_close(losses[0][0], losses[1][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(losses[0][1], losses[1][1], rtol=1e-3, atol=1e-5)


def test_step_rate_counts_the_steps_it_timed() -> None:
    config = _config()
    pool = build_task(config).load_test()
    rate = time_training_steps(config, pool, batch_size=4, device=torch.device("cpu"), bf16=False, seconds=0.05)
    assert rate.steps >= 10 and rate.steps % 10 == 0  # whole rounds between synchronisations
    assert rate.seconds >= 0.05 and rate.first_step_s > 0
    assert rate.steps_per_s == pytest.approx(rate.steps / rate.seconds)
    assert rate.model_tflops == pytest.approx(6 * rate.parameters * rate.steps_per_s * 4 * pool.tokens.shape[1] / 1e12)
    assert rate.peak_memory_gib is None  # measured on CUDA only


def test_bench_page_compares_settings_at_equal_batch(tmp_path: Path) -> None:
    bench = importlib.import_module("benchmarks.bench_train_step")
    out = tmp_path / "page"
    bench.main([*TINY, "--device", "cpu", "--batch-sizes", "2", "4", "--compile", "off", "--seconds", "0.05",
                "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    settings = [(r["batch_size"], r["compile"], r["compiled"]) for r in data["rows"]]
    assert settings == [(2, "off", False), (4, "off", False)]
    assert all(r["vs_eager"] == 1.0 and r["steps"] >= 10 for r in data["rows"])
    page = out.with_suffix(".md").read_text()
    assert "| 4 | off |" in page and "python -m benchmarks.bench_train_step" in page
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_setting_that_fails_is_recorded_and_the_others_still_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bench = importlib.import_module("benchmarks.bench_train_step")
    timed = bench.time_training_steps

    def compiled_runs_out_of_memory(config: dict, *args: object, **kwargs: object) -> object:
        if config["compile"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return timed(config, *args, **kwargs)

    monkeypatch.setattr(bench, "time_training_steps", compiled_runs_out_of_memory)
    out = tmp_path / "page"
    bench.main([*TINY, "--device", "cpu", "--batch-sizes", "2", "--compile", "off", "on", "--seconds", "0.05",
                "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["compile"] for r in data["rows"]] == ["off"]
    assert data["failed"] == [{"batch_size": 2, "compile": "on",
                               "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}]
    assert "compile on: failed, `OutOfMemoryError: CUDA out of memory" in out.with_suffix(".md").read_text()

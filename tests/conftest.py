"""Shared fixtures: Hydra composition of the real configs, tiny settings, an isolated data cache."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
# How long a test waits for a subprocess: a guard against hangs, never a speed check (a loaded 2-core machine may
# be many times slower than an idle one). pytest-timeout (pyproject.toml) is the outer guard.
WAIT_S = 1500
# The real GSM8K / HumanEval / MBPP files (never downloaded by tests): $MDMKIT_BENCHMARK_DATA, else ../shared beside
# the checkout. Tests that need them skip, naming the path, where they are absent.
BENCHMARK_DATA = Path(os.environ.get("MDMKIT_BENCHMARK_DATA", ROOT.parent / "shared" / "data" / "benchmarks"))
# How close float32 logits must be to those the official code wrote on another machine. Measured on the Fast-dLLM
# v2 fixture: both its logits and ours are ~1.4e-4 from the float64 result, yet agree with each other to 1.3e-5
# on an AVX2 CPU (closer on the machine that wrote them): the kernels' summation order differs by CPU. 3e-5 stays
# five times inside float32's own error, so any real difference (a quirk, a mask, a bias) still fails.
FIXTURE_LOGITS = {"atol": 3e-5, "rtol": 0.0}
# Tiny checkpoints of real dLLM architectures with the official code's outputs: $MDMKIT_REFERENCE_MODELS, else
# ../shared beside the checkout (each directory's SOURCE.md says how they were made).
REFERENCE_MODELS = Path(os.environ.get("MDMKIT_REFERENCE_MODELS", ROOT.parent / "shared" / "reference_models"))

# Under pytest-xdist (`make test` runs two workers) each worker, and every process it starts, takes its share of
# the cores: torch's default of a thread per core in each worker would oversubscribe them, and its threads spin
# waiting for each other. An OMP_NUM_THREADS set by the caller wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# A configuration that trains in seconds on a CPU; tests add their own overrides on top.
TINY = [
    "model=tiny",
    "logger=csv",
    "task.n_train=300",
    "task.n_val=40",
    "task.n_test=40",
    "task.workers=1",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.enable_progress_bar=false",
    "data.batch_size=8",
    "data.eval_batch_size=32",
    "data.val_examples=16",
    "optim.warmup_steps=2",
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path_factory.getbasetemp() / "data-cache"  # shared by the session: generate once
    monkeypatch.setenv("MDMKIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.fixture
def allow_code_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    """The opt-in the code sandbox asks for (tests/test_sandbox*.py use it for every test)."""
    from mdmkit.sandbox import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "1")


@pytest.fixture(params=["bwrap", "process"])
def mode(request: pytest.FixtureRequest) -> str:
    """The sandbox's two isolation modes; bwrap skips, naming why, where it cannot run."""
    from mdmkit.sandbox import isolation

    usable, why = isolation.bwrap_status()
    if request.param == "bwrap" and not usable:
        pytest.skip(f"no bwrap here: {why}")
    return request.param


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique argv[0] for a sandbox attack's sleepers (`os.execv('/bin/sleep', [marker, '30'])`); any left
    are killed afterwards, so even a failed test leaves nothing behind."""
    import signal
    import uuid

    from sandbox_support import leftovers

    name = f"mdmkit-attack-{uuid.uuid4().hex[:12]}"
    yield name
    for pid in leftovers(name):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny forwards run fastest, and share two cores best, on one intra-op thread (modules opt in)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def masked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Hugging Face masked LM with its tokenizer, saved once per session."""
    from tiny_text_models import save_masked_lm

    return save_masked_lm(tmp_path_factory.mktemp("masked"))


@pytest.fixture(scope="session")
def causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Hugging Face causal LM with its tokenizer, saved once per session."""
    from tiny_text_models import save_causal_lm

    return save_causal_lm(tmp_path_factory.mktemp("causal"))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Sudoku model trained for one step (`fast_dev_run`), saved once per session: tests only read it."""
    from mdmkit.training.preflight import plan_training
    from mdmkit.training.train import run_training

    out = tmp_path_factory.mktemp("tiny-model")
    cfg = compose_config("train", [*TINY, "trainer.fast_dev_run=true", f"results_file={out}/train.jsonl"])
    run_training(plan_training(cfg), out)
    return out / "model.pt"


def compose_config(config_name: str = "train", overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    with initialize_config_module("mdmkit.conf", version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def run_cli(script: str, *overrides: str, cwd: Path, timeout: float = WAIT_S,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python train.py|evaluate.py overrides...` as a user would, in `cwd` (`env` added to the environment)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *overrides],
        cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout,
    )


# Runs each case of `run_cli_cases` in turn in one interpreter: argv, working directory, captured output, exit code.
_CASES_DRIVER = """
import contextlib, io, json, os, runpy, sys
cases_file, results_file = sys.argv[1:3]
cases = json.loads(open(cases_file).read())
sys.path.insert(0, os.path.dirname(next(iter(cases.values()))[1][0]))  # as `python train.py` puts the script's folder
results = {}
for name, (cwd, argv) in cases.items():
    os.chdir(cwd)
    sys.argv = argv
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException as error:  # a case that raises fails alone (its traceback's last line as its output)
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
            code = 1
    results[name] = [code, out.getvalue(), err.getvalue()]
open(results_file, "w").write(json.dumps(results))
"""


def run_cli_cases(script: str, cases: dict[str, tuple[Path, list[str]]], *, env: dict[str, str] | None = None,
                  timeout: float = WAIT_S) -> dict[str, subprocess.CompletedProcess]:
    """`run_cli` for many cases (name: (cwd, overrides)) that stop before any work, in one interpreter.

    Each `python train.py ...` costs seconds of imports before it reaches its one-line error; a shared interpreter
    pays them once. Each case still runs the script as `__main__` with its own argv and working directory, its
    output and exit code captured apart. What one case imported stays imported for the next: to check that a case
    stops before some module loads, make that module unimportable (`env` with a stand-in on PYTHONPATH)."""
    spec = {name: [str(cwd), [str(ROOT / script), *overrides]] for name, (cwd, overrides) in cases.items()}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    with tempfile.TemporaryDirectory() as scratch:
        cases_file, results_file = Path(scratch) / "cases.json", Path(scratch) / "results.json"
        cases_file.write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, "-c", _CASES_DRIVER, str(cases_file), str(results_file)], cwd=scratch,
                              env=env, capture_output=True, text=True, check=False, timeout=timeout)
        assert done.returncode == 0 and results_file.is_file(), done.stderr[-3000:]
        results = json.loads(results_file.read_text())
    return {name: subprocess.CompletedProcess(spec[name][1], code, out, err)
            for name, (code, out, err) in results.items()}


def load_script(name: str) -> ModuleType:
    """`scripts/NAME.py` as a module, to call its functions (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args: str, cache_dir: Path, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    """`python scripts/NAME.py args...` as a user would run it, from the checkout, with its own data cache."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "MDMKIT_CACHE_DIR": str(cache_dir)})


def reference_runs(name: str, label: str) -> tuple[Path, dict[str, Any], list[pytest.MarkDecorator]]:
    """A reference model's directory, the runs of its official generate (`generate.json`; empty where absent) and
    the marks for a module replaying them: skipped, naming the file, where it is absent; one thread, as the runs'
    float32 sums were made."""
    fixture = REFERENCE_MODELS / name
    runs_file = fixture / "generate.json"
    runs = json.loads(runs_file.read_text()) if runs_file.is_file() else {}
    skip = pytest.mark.skipif(not runs_file.is_file(), reason=f"{label}'s runs not found: {runs_file}")
    return fixture, runs, [skip, pytest.mark.usefixtures("one_thread")]


@functools.cache
def reference_network(name: str, kind: str, mask_id: int | None = None, dtype: torch.dtype = torch.float32) -> Any:
    """The reference model `name` loaded natively as `kind`, once per test process."""
    from mdmkit.models.llm.checkpoints import load_diffusion_lm

    return load_diffusion_lm(REFERENCE_MODELS / name, kind, mask_id=mask_id, dtype=dtype)

"""The wheel ships the package with its Hydra configs (top-level conf/, installed as `mdmkit.conf`), so an
installed mdmkit composes its configs from any directory, with no checkout in sight."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import WAIT_S

ROOT = Path(__file__).resolve().parents[1]


def _run(*command: str | Path, cwd: Path, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site) if site else ""}
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=WAIT_S, check=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built, offline, from a copy of the checkout (the build writes nothing into the checkout)."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("mdmkit", "conf"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", work / "dist",
         source, cwd=work)
    return next((work / "dist").glob("mdmkit-*.whl"))


def test_the_wheel_holds_every_module_and_config_of_the_checkout(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mdmkit").rglob("*.py")}
    configs = {"mdmkit/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    task_configs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mdmkit/lm_eval_tasks").glob("*.yaml")}
    assert "mdmkit/conf/sampler/eb.yaml" in configs
    assert not (modules | configs | task_configs) - shipped


def test_the_installed_cli_finds_its_configs_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = _run(sys.executable, "-c", "import mdmkit, importlib.resources as r; "
                   "print(mdmkit.__file__); print(r.files('mdmkit.conf') / 'evaluate.yaml')",
                   cwd=elsewhere, site=site).stdout.split()
    assert all(Path(path).is_relative_to(site) and Path(path).is_file() for path in located), located

    help_text = _run(sys.executable, site / "bin/mdmkit-evaluate", "--help", cwd=elsewhere, site=site).stdout
    groups = help_text.split("== Groups (group=option) ==")[1].split("== Examples ==")[0]  # mdmkit's own --help
    assert {"sampler=topk", "task=null", "eb", "topk", "ni", "sudoku"} <= set(groups.replace(",", " ").split())
    composed = _run(sys.executable, site / "bin/mdmkit-evaluate", "sampler=eb", "sampler.gamma=0.5", "--cfg", "job",
                    cwd=elsewhere, site=site).stdout
    assert "_target_: mdmkit.samplers.EBSampler" in composed and "gamma: 0.5" in composed

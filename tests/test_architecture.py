"""The package's shape holds: layers import only downwards, no module imports itself back, light imports stay light.

The layers contract lives in pyproject.toml ([tool.importlinter]) and is checked by import-linter. To show that
the check can fail, one test runs it on a copy of the package with a single upward import added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
from conftest import WAIT_S

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter on the `mdmkit` found first on the path from `root`, with `root`'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
                          cwd=root, env=env, capture_output=True, text=True, check=False, timeout=WAIT_S)


def test_the_layers_contract_holds() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_the_layers_contract_fails_on_an_upward_import(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "mdmkit", tmp_path / "mdmkit", ignore=shutil.ignore_patterns("__pycache__", "conf"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    tasks = tmp_path / "mdmkit/tasks/base.py"
    tasks.write_text(tasks.read_text() + "\nfrom mdmkit.samplers.rules.topk import TopKSampler  # upward\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "mdmkit.tasks is not allowed to import mdmkit.samplers" in result.stdout
    assert "mdmkit.tasks.base -> mdmkit.samplers.rules.topk" in result.stdout


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere, also inside a layer (the contract only orders the layers)."""
    graph = grimp.build_graph("mdmkit")
    cycles = [
        (module, other) for module in graph.modules for other in graph.find_modules_directly_imported_by(module)
        if module != other and graph.chain_exists(importer=other, imported=module)
    ]
    assert not cycles, f"import cycles through: {sorted(cycles)[:5]}"


def test_importing_a_task_loads_neither_samplers_nor_models() -> None:
    code = ("import sys, mdmkit.tasks.sudoku, mdmkit.tasks.maze, mdmkit.tasks.gsm8k, mdmkit.tasks.code; "
            "print(sorted(m for m in sys.modules if m.startswith(('mdmkit.samplers', 'mdmkit.models', "
            "'mdmkit.evaluation', 'mdmkit.training', 'lightning'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, check=True)
    assert loaded.stdout.strip() == "[]"


def test_importing_the_command_line_module_changes_nothing_of_the_process() -> None:
    """Warning filters, environment, logging filters and the --help resolver are set by the entry points."""
    code = ("import logging, os, warnings\nfrom omegaconf import OmegaConf\n"
            "names = ('lightning.pytorch.utilities.rank_zero', 'lightning.fabric.utilities.rank_zero')\n"
            "def state():\n"
            "    return (len(warnings.filters), 'WANDB_SHOW_INFO' in os.environ,\n"
            "        OmegaConf.has_resolver('mdmkit_options'), [len(logging.getLogger(n).filters) for n in names])\n"
            "before = state()\nimport mdmkit.cli\nprint(before == state(), state())\n"
            "mdmkit.cli.process.set_up_process()\nprint(before == state())\n")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SHOW_INFO"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, check=True,
                          env=env)
    assert done.stdout.split("\n")[0].startswith("True") and done.stdout.split("\n")[1] == "False", done.stdout

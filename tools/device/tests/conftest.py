"""The device tools' tests reuse the project's test settings (tests/conftest.py) under their own module name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("mdmkit_tests_conftest",
                                               Path(__file__).resolve().parents[3] / "tests" / "conftest.py")
_project = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_project)

ROOT, TINY, WAIT_S = _project.ROOT, _project.TINY, _project.WAIT_S
_isolated = _project._isolated  # the same isolated data cache as every project test

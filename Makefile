# Two entry points for a fresh machine: `make demo` and `make test` (see README).
# TORCH selects the torch build; the default is the CPU wheel this project is developed on.
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: install demo test

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "install: $(TORCH) into $(VENV) (about a minute; then mdmkit's dependencies, a few minutes more)"
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	@echo "install: mdmkit and its pinned dependencies (constraints.txt)"
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev]"
	@echo "install: done; run commands with $(VENV)/bin/python (or source $(VENV)/bin/activate)"
	touch $@

demo: install
	$(PY) train.py experiment=quickstart

test: install
	$(PY) -m pytest -q -n 2

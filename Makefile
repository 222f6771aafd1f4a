# The two set-up commands (see README.md): `make up` and `make test`.
# Both create .venv from the hashed lock file on first use. Packages are byte-compiled at
# install: without it every process (proxy, Dagster, test helpers) recompiles dagster and
# litellm from source, ~11 s per `import` here when bytecode writing is off.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint lock

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else "claw-pipelines needs Python >= 3.11, and $(PYTHON) is " + sys.version.split()[0] + ": run make with PYTHON=python3.11 (or newer)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --require-hashes -r requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python --no-deps -e .
	$(BIN)/python scripts/check_supply_chain.py
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/claw up

test: $(STAMP)
	scripts/ensure_chromium.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -o requirements.lock

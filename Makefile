# Two commands a user needs: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pinned: here this takes the local CPU wheel; never let pip pick a newer CUDA build.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[train,data,tensorboard,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/piebald demo --force

# Everything: lint, types, the docs site (strict: a broken link fails) and every test.
test: $(STAMP) docs
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/pytest -n auto --durations=25

# The quick loop while changing code: unit tests without the slow and multi-process ones.
test-fast: $(STAMP)
	$(BIN)/pytest -n auto -q -m "not slow and not distributed"

# The documentation site into site/ (open site/index.html).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format
	$(BIN)/ruff check --fix

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out site

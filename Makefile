# Two commands a user needs: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pinned: here this takes the local CPU wheel; never let pip pick a newer CUDA build.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[train,data,tensorboard,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/piebald demo --force

test: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/pytest -n auto

lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format
	$(BIN)/ruff check --fix

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out

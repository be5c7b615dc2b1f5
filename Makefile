# headlab: `make train` and `make test` work on a fresh clone; each creates .venv first when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
TORCH := torch==2.13.0

.PHONY: help install train sweep experiments confirmations text-experiments test test-fast bench lint format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

install: $(STAMP)  ## create .venv for training: torch 2.13.0 (CPU) first, then headlab (the tests add their own)

# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

# what the tests and lint need beside: the dev and optuna extras, and Triton (for the GPU kernel's tests in its
# interpreter, tests/triton_interpreted.py) in .venv/triton, off the path: torch imports an installed Triton in
# every process, 0.2-0.3 s each, over a hundred CLI runs in the tests
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,optuna]'
	$(BIN)/python -m pip install --quiet --upgrade --target $(VENV)/triton 'triton>=3.0'
	touch $(TEST_STAMP)

train: $(STAMP)  ## train the default model (ARGS='key=value ...' overrides)
	$(BIN)/headlab-train $(ARGS)

sweep: $(STAMP)  ## a small sweep: 1 and 4 heads, 3 seeds
	$(BIN)/headlab-train -m model.attention.n_heads=1,4 seed=0,1,2 $(ARGS)

# the ablations of experiments/ on generated data, and on SST-2 when SST2 names a folder with its files; a sweep
# with failed runs (a diverged learning rate) still gets its table, which lists them
EXPERIMENTS ?= heads_fixed_width key_size scoring fixed_head_size head_pruning heads_vs_depth
SST2 ?=
SST2_FILES.sst2_heads_fixed_width = data=files data.files.train=$(SST2)/train.tsv data.files.test=$(SST2)/dev.tsv \
  data.text_column=sentence
SST2_FILES.sst2_scoring = data.files.train=$(SST2)/train.tsv data.files.val=$(SST2)/dev.tsv \
  data.files.test=$(SST2)/test_labeled_senteval.tsv

experiments: $(STAMP)  ## run every ablation (hours on a CPU, ARGS=trainer=gpu: minutes) into experiments/RESULTS.md
	for e in $(EXPERIMENTS); do \
	  $(BIN)/headlab-train experiment=$$e hydra.sweep.dir=multirun/experiments/$$e $(ARGS); \
	  $(BIN)/headlab-compare multirun/experiments/$$e --out experiments/results/$$e --into experiments/RESULTS.md \
	    --archive experiments/results/$$e/runs.tar.xz || exit 1; done
	if [ -n "$(SST2)" ]; then $(foreach e,sst2_heads_fixed_width sst2_scoring, \
	  $(BIN)/headlab-train experiment=$(e) $(SST2_FILES.$(e)) hydra.sweep.dir=multirun/experiments/$(e) $(ARGS); \
	  $(BIN)/headlab-compare multirun/experiments/$(e) --out experiments/results/$(e) --into experiments/RESULTS.md \
	    --archive experiments/results/$(e)/runs.tar.xz || exit 1;) fi

# the confirmations the experiment files state (their confirm key): seeds 10-19, the same grid, read with
# headlab-compare --confirm into each experiment's NAME/confirm block of experiments/RESULTS.md
CONFIRM ?= heads_fixed_width key_size fixed_head_size

confirmations: $(STAMP)  ## run the stated confirmations on seeds 10-19 (ARGS=sweep.resume=true continues them)
	for e in $(CONFIRM); do \
	  $(BIN)/headlab-train experiment=$$e 'seed=range(10,20)' hydra.sweep.dir=multirun/confirm/$$e $(ARGS); \
	  $(BIN)/headlab-compare multirun/confirm/$$e --confirm --out experiments/results/$$e/confirm \
	    --into experiments/RESULTS.md --archive experiments/results/$$e/confirm/runs.tar.xz || exit 1; done
	if [ -n "$(SST2)" ]; then $(foreach e,sst2_heads_fixed_width sst2_scoring, \
	  $(BIN)/headlab-train experiment=$(e) $(SST2_FILES.$(e)) 'seed=range(10,20)' \
	    hydra.sweep.dir=multirun/confirm/$(e) $(ARGS); \
	  $(BIN)/headlab-compare multirun/confirm/$(e) --confirm --out experiments/results/$(e)/confirm \
	    --into experiments/RESULTS.md --archive experiments/results/$(e)/confirm/runs.tar.xz || exit 1;) fi

# the text experiments over the six datasets (SST-2 from its files under DATA): one sweep per dataset, folds x one
# seed where the data cross-validates, then one reading of all six into experiments/RESULTS.md. text_defaults_search
# runs its first stage here (the cross-validated four on folds 0-2); its finalists are chosen from that reading
TEXT ?= text_heads_fixed_width text_defaults_search
DATA ?= ../shared/data
TEXT_DATA = sst2 mr subj cr mpqa sst5
TEXT_DATA.sst2 = data=files data.files.train=$(abspath $(DATA))/sst2/train.tsv \
  data.files.test=$(abspath $(DATA))/sst2/dev.tsv data.text_column=sentence
TEXT_DATA.sst5 = data=sst5
$(foreach d,mr subj cr mpqa,$(eval TEXT_DATA.$(d) = data=$(d) seed=0))
TEXT_FOLDS.text_defaults_search = data.cv.fold=0,1,2
text_run = $(BIN)/headlab-train experiment=$(1) $(TEXT_DATA.$(2)) $(if $(filter mr subj cr mpqa,$(2)),$(TEXT_FOLDS.$(1))) \
  hydra.sweep.dir=multirun/$(1)/$(2) $(ARGS)

text-experiments: $(STAMP)  ## run the text experiments on six datasets (a day on a GPU; ARGS=sweep.resume=true continues)
	$(foreach e,$(TEXT),$(foreach d,$(TEXT_DATA),HEADLAB_DATA=$(abspath $(DATA)) $(call text_run,$(e),$(d)) &&) \
	  $(BIN)/headlab-compare $(foreach d,$(TEXT_DATA),multirun/$(e)/$(d)) --out experiments/results/$(e) \
	    --into experiments/RESULTS.md --archive experiments/results/$(e)/runs.tar.xz || exit 1;)

# pytest exits 5 when it collects no test (for example, a -k that matches nothing): not a failure
PYTEST = $(BIN)/python -m pytest -q $(1) $(ARGS); code=$$?; [ $$code -eq 5 ] && code=0; exit $$code

# one pytest-xdist worker per core, up to 4 (tests/conftest.py gives each its own cores); ARGS="-n 0": one process
XDIST = -n auto --maxprocesses=4 --dist worksteal

test: $(TEST_STAMP)  ## the whole test suite (what CI runs)
	$(call PYTEST,$(XDIST) --durations=30)

test-fast: $(TEST_STAMP)  ## the tests without end-to-end CLI runs
	$(call PYTEST,$(XDIST) -m "not e2e")

bench: $(STAMP)  ## rewrite BENCHMARKS.md (41-58 min on 2 idle cores of a 132-199 GFLOP/s matmul, 29 at 421: BENCHMARKS.md names its own; each section said as it starts, with the time left)
	$(BIN)/headlab-bench --sst2-recipe $(ARGS)

lint: $(TEST_STAMP)  ## ruff check and format check
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(TEST_STAMP)  ## ruff fix and format
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean:  ## remove .venv, build outputs and run directories
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache outputs multirun lightning_logs

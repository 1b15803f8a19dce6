# The two set-up commands. Both create .venv if needed and install what they need.
#   make demo   train the built-in digits recipe
#   make test   run the whole test suite
# And beside them: make test-fast, the fast subset (tests marked fast, under a minute on 2 cores).
PYTHON ?= python3
VENV ?= .venv
# On a machine whose pip finds these on local disk they install offline; elsewhere pip fetches them.
TORCH ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

.PHONY: demo test test-fast test-slow lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Torch first and pinned, so that resolving the package's ranges never pulls another build.
$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	touch $@

# setup.py builds the C extension (csrc/): an edit there rebuilds it.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard csrc/*.c) $(VENV)/.torch
	$(BIN)/pip install --quiet -e . $(TORCH)
	touch $@

$(VENV)/.installed-dev: pyproject.toml setup.py $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[dev]' $(TORCH)
	touch $@

demo: $(VENV)/.installed
	$(BIN)/bigbatch train digits

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 --dist worksteal -q --durations=15 -m "not slow" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# One process: on 2 cores the fast subset takes longer in two workers, each importing torch, than in one (2026-12-03,
# load average 7 on the project's 2-core machine: 42 s in one process, 82 s with -n 2).
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 0 -q -m fast --durations=5 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# The large stock Darknet cfgs against Darknet's own outputs (p6/p7 detectors, VGG, ResNet-152...): minutes.
test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 -q --durations=15 -m slow tests

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check bigbatch tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache

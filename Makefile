# Two entry points on a fresh clone:
#   make demo   set up .venv if needed, run real models through the backend and check vs eager
#   make test   set up .venv if needed, run the test suite (all tiers, slow ones included)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is installed first so no later step pulls a multi-GB CUDA build.
# On a GPU machine with its own torch, use: make test VENV_FLAGS=--system-site-packages TORCH_SPEC=
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-fast setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install --quiet "$(TORCH_SPEC)"; fi
	$(PY) -m pip install --quiet -e '.[demo,test,cutedsl,sycl]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/tilewright demo

test: $(VENV)/.installed
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(PY) -m pytest -n 2 -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

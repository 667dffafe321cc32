# Two entry points on a fresh clone:
#   make demo   set up .venv if needed, run real models through the backend and check vs eager
#   make test   set up .venv if needed, run the test suite's fast tier (under 20 minutes on 2 cores)
#   make test-slow  the slow tier (real models end to end, subprocesses, AOT CLI builds); CI
#               (.ci/run) runs both tiers; make test-all runs both in one pytest session
#   make fuzz   the differential fuzzer, long, from a fresh seed (docs/fuzzing.md)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is installed first so no later step pulls a multi-GB CUDA build.
# On a GPU machine with its own torch, use: make test VENV_FLAGS=--system-site-packages TORCH_SPEC=
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-slow test-all fuzz setup flydsl-setup clean compat compat-smoke compat-old compat-new

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install --quiet "$(TORCH_SPEC)"; fi
	$(PY) -m pip install --quiet -e '.[demo,test,cutedsl,sycl,flydsl,helion]'
	touch $@

# FlyDSL links its gfx950 code objects with ld.lld, looked up under $$ROCM_PATH/llvm/bin, and
# wants $$ROCM_PATH/amdgcn/bitcode/ to exist (empty is fine): $(VENV)/rocm is laid out that way,
# with Debian's lld-19 (installed here when missing and apt can). Without it the FlyDSL
# compile tests skip, naming this step.
ROCM_DIR := $(VENV)/rocm
$(ROCM_DIR)/llvm/bin/ld.lld: $(VENV)/.installed
	@command -v ld.lld-19 >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -qq lld-19 >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null && apt-get install -y -qq lld-19 >/dev/null)) || true; \
	  fi; }
	@if command -v ld.lld-19 >/dev/null; then \
	  mkdir -p $(ROCM_DIR)/llvm/bin $(ROCM_DIR)/amdgcn/bitcode && \
	  ln -sf "$$(command -v ld.lld-19)" $@; \
	else echo "flydsl-setup: ld.lld-19 not found and apt-get unavailable: FlyDSL compiles will skip (apt-get install lld-19)"; fi

flydsl-setup: $(ROCM_DIR)/llvm/bin/ld.lld

setup: $(VENV)/.installed flydsl-setup

demo: $(VENV)/.installed flydsl-setup
	$(VENV)/bin/tilewright demo

# the 30 slowest tests are listed at the end of every run: the fast tier must stay under 20
# minutes on 2 cores as it grows, and the list says where its time goes. Tests that run real
# models end to end, subprocesses or whole AOT builds are marked slow (pytest -m slow): their own
# tier, which CI runs too (.ci/run). The whole suite in one session took 30 min on 2 cores
# (2026-12-06, 4,338 tests, the demo test alone 8 min).
test: $(VENV)/.installed flydsl-setup
	$(PY) -m pytest -n 2 -q -m "not slow" --durations=30 $(PYTEST_ARGS)

test-fast: test

test-slow: $(VENV)/.installed flydsl-setup
	$(PY) -m pytest -n 2 -q -m slow --durations=30 $(PYTEST_ARGS)

test-all: $(VENV)/.installed flydsl-setup
	$(PY) -m pytest -n 2 -q --durations=30 $(PYTEST_ARGS)

# the differential fuzzer (tests/fuzz/) for long: FUZZ_EXAMPLES programs per emitter mode
# (FUZZ_MODES), from the seed FUZZ_SEED (fresh unless given; printed, so a run can be repeated);
# a find prints its program as a reproducer and stays in .hypothesis/fuzz for the next run
FUZZ_SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
FUZZ_EXAMPLES ?= 300
FUZZ_MODES ?= triton,cpp,auto
fuzz: $(VENV)/.installed
	@echo "fuzz seed: $(FUZZ_SEED)  (repeat: make fuzz FUZZ_SEED=$(FUZZ_SEED) FUZZ_MODES=$(FUZZ_MODES) FUZZ_EXAMPLES=$(FUZZ_EXAMPLES))"
	FUZZ_PROFILE=fuzz FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_MODES=$(FUZZ_MODES) $(PY) -m pytest -n 0 -q \
	  -p no:randomly tests/fuzz/test_fuzz.py -k compiled --hypothesis-seed=$(FUZZ_SEED) \
	  --hypothesis-show-statistics $(PYTEST_ARGS); rc=$$?; \
	  echo "fuzz seed: $(FUZZ_SEED)"; exit $$rc

# The compatibility check: the suite's fast tier from this checkout on PYTHONPATH (nothing of
# tilewright installed, as on the GPU machine) under the oldest versions pyproject claims and
# under the newest torch pip can install here. bench/compat.sh has the details and the numbers.
#   make compat         both, the whole fast tier (-m "not slow")
#   make compat-smoke   the old versions only, a sample of the suite plus
#                       bench/device_check.sh --dry-run (what .ci/run runs)
# Each venv is built once and reused (.venv-compat*, ignored by git).
compat-smoke:
	bash bench/compat.sh old smoke

compat-old:
	bash bench/compat.sh old fast

compat-new:
	bash bench/compat.sh new fast

compat: compat-old compat-new

clean:
	rm -rf $(VENV) .venv-compat .venv-compat-new .pytest_cache

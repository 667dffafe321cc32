#!/usr/bin/env bash
# The compatibility check: the test suite from this checkout on PYTHONPATH, with nothing of
# tilewright installed (the GPU machine's way, see bench/device_check.sh), under
#   old: the oldest versions pyproject.toml claims, as the GPU machine has them:
#        torch 2.11.0 (PyPI's CUDA build: it imports and runs on a CPU-only machine),
#        triton 3.6.0, numpy 2.x. The GPU machine has numpy 2.5, but triton 3.6's interpreter
#        (what runs Triton kernels on a CPU) fails under numpy >= 2.4, so numpy < 2.4 here.
#   new: the newest torch pip installs here (2.14.1: pip is capped there on this machine) and
#        the triton it pins.
# Each venv (.venv-compat, .venv-compat-new; ignored by git) is built once and reused while the
# package list below is unchanged; its build time and size land in VENV/install.json.
#
# usage: bench/compat.sh old|new setup|smoke|fast [pytest args...]
#   setup: build the venv only
#   smoke: a sample of the suite (the backend by name from the checkout, loop/attention/GEMM
#          kernels, AOT with the triton-version refusals, PDL) and, for `old`,
#          bench/device_check.sh --dry-run: what .ci/run runs (about 5 min with a built venv)
#   fast:  the suite's fast tier (-m "not slow") on 2 workers
# env: PYTHON (the interpreter the venv is made from, default python3), COMPAT_VENV,
#      COMPAT_NEW_VENV, COMPAT_OUT (where device_check's dry run writes; default a temp folder)
#
# Measured on the 2-core CPU machine (2026-12-06), old venv from nothing: 5.0 GB on disk, about
# 1.7 GB of it downloaded from PyPI, ~1 min of CPU; 2 to 4.5 min on a quiet machine, 20 min while
# eight other jobs shared it (docs/user-guide.md, "Versions"). `pip install --no-deps
# torch==2.11.0` alone does not import (libcudnn.so.9 missing), so the CUDA libraries come along.
set -euo pipefail
WHICH="${1:?usage: bench/compat.sh old|new smoke|fast [pytest args...]}"
TIER="${2:?usage: bench/compat.sh old|new smoke|fast [pytest args...]}"
shift 2
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY0="${PYTHON:-python3}"

# what the GPU machine has besides torch/triton/numpy that the tests use, transformers at its
# version (nothing more: a test needing another package skips, as it would there)
DEPS="jinja2 sympy networkx filelock rich pytest pytest-xdist pytest-timeout hypothesis psutil
      matplotlib transformers==5.17.0"
case "$WHICH" in
    old) VENV="${COMPAT_VENV:-.venv-compat}"; SPEC="torch==2.11.0 triton==3.6.0 numpy>=2,<2.4" ;;
    new) VENV="${COMPAT_NEW_VENV:-.venv-compat-new}"; SPEC="torch==2.14.1 numpy" ;;
    *) echo "compat: unknown version set '$WHICH' (old or new)" >&2; exit 2 ;;
esac
mkdir -p "$(dirname "$VENV")"
VENV="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
STAMP="$VENV/.installed-$(echo "$SPEC $DEPS" | sha1sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
    # a venv of an older list is brought up to date in place (pip installs only the change)
    echo "compat: building $VENV ($SPEC)"
    T0=$(date +%s)
    FRESH=false
    [ -x "$VENV/bin/python" ] || { "$PY0" -m venv "$VENV"; FRESH=true; }
    # shellcheck disable=SC2086 - SPEC and DEPS are lists of requirements
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $SPEC $DEPS 2>&1 \
        | { grep -v '^WARNING: Location' || true; }
    rm -f "$VENV"/.installed-*
    SECONDS_TAKEN=$(( $(date +%s) - T0 ))
    MB=$(du -sm "$VENV" | cut -f1)
    printf '{"spec": "%s", "from_nothing": %s, "seconds": %d, "mb": %d}\n' \
        "$SPEC" "$FRESH" "$SECONDS_TAKEN" "$MB" > "$VENV/install.json"
    touch "$STAMP"
fi
PY="$VENV/bin/python"
echo "compat: $("$PY" -c 'import torch, triton, numpy; print(f"torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}")'), venv $(cat "$VENV/install.json" 2>/dev/null)"
if (cd / && env -u PYTHONPATH "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("tilewright") is None)'); then
    echo "compat: tilewright is installed in $VENV: the check must run from the checkout alone" >&2
    exit 2
fi

[ "$TIER" = setup ] && exit 0
export PYTHONPATH="$REPO"
export TILEWRIGHT_CACHE_DIR="$(mktemp -d /tmp/tilewright-compat.XXXXXX)"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -p no:randomly -n 2)
case "$TIER" in
    smoke)
        "${PYTEST[@]}" tests/test_checkout.py "$@"
        "${PYTEST[@]}" -m "not slow" tests/test_targets.py \
            tests/test_backend.py tests/test_triton_gemm.py tests/test_loop_kernels.py \
            tests/test_attention_kernels.py tests/test_aot.py tests/test_pdl.py "$@"
        # where triton 3.6's interpreter differs from 3.9's (signed zeros, bool arithmetic)
        "${PYTEST[@]}" tests/test_loop_ops.py -k "copysign or neg" "$@"
        "${PYTEST[@]}" tests/test_special_values.py -k "triton and (neg or copysign or sign)" "$@"
        if [ "$WHICH" = old ]; then
            OUT="${COMPAT_OUT:-$(mktemp -d /tmp/tilewright-compat-dry.XXXXXX)}"
            PYTHON="$PY" bash bench/device_check.sh "$OUT" --dry-run
        fi
        ;;
    fast) "${PYTEST[@]}" -m "not slow" --durations=15 "$@" ;;
    *) echo "compat: unknown tier '$TIER' (smoke or fast)" >&2; exit 2 ;;
esac

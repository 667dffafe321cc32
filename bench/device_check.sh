#!/usr/bin/env bash
# The GPU check, in one run of under 8 minutes on an H200 that has only its own torch/triton:
#   1. the correctness suite's GPU part (pytest -m gpu),
#   1b. the attention rows (bench/attention_check.py: each generated attention kernel checked
#      against float64 and timed beside ATen: prefill, backward, decode, a flex sliding window),
#   1c. the Helion templates against the jinja Triton ones and ATen (bench/helion_check.py:
#      residual RMSNorm, softmax, Linear + GELU; skipped when helion is not installed),
#   2. the bench suite on the shapes of bench/cases/llm_gemm_shapes.json (bf16 decode and
#      prefill, Llama-3-8B and Qwen3-30B-A3B): tilewright's choice vs ATen per problem,
#      then the NVFP4 decode rows (nvfp4-check: the same dense layers as W4A4 GEMMs at M = 1,
#      16, 64; ATen's row is the dequantised matmul),
#   3. the gate against bench/baselines/<arch>/<suite>.json when that baseline exists,
# writing JSON (and logs) into OUT_DIR and printing the results table last.
#
# usage: bench/device_check.sh OUT_DIR [--dry-run]
#   --dry-run: the same steps on the CPU with the tiny suite (what CI's test of this script runs)
# env: PYTHON (default python3), TILEWRIGHT_CACHE_DIR (default: a fresh folder under /tmp)
#
# Nothing is installed: tilewright runs from this checkout through PYTHONPATH, with the
# machine's own torch and triton (never reinstalled).
set -uo pipefail

OUT="${1:?usage: bench/device_check.sh OUT_DIR [--dry-run]}"
MODE="${2:-}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEWRIGHT_CACHE_DIR="${TILEWRIGHT_CACHE_DIR:-$(mktemp -d /tmp/tilewright-check.XXXXXX)}"
START=$(date +%s)

if [ "$MODE" = "--dry-run" ]; then
    SUITE=tiny; TARGET=cpu; TEST_TIMEOUT=300; HELION_TIMEOUT=300; BENCH_BUDGET=60; BENCH_TIMEOUT=120
    NVFP4_SUITE=""; NVFP4_BUDGET=0; NVFP4_TIMEOUT=0
    ATTN_BUDGET=60; ATTN_TIMEOUT=120; ATTN_FLAGS=--dry-run
else
    # 180 s + 45 s + 40 s + 120 s + 75 s + a few seconds for the rest stays under 8 minutes
    SUITE=h200-check; TARGET=""; TEST_TIMEOUT=180; HELION_TIMEOUT=40; BENCH_BUDGET=85; BENCH_TIMEOUT=120
    NVFP4_SUITE=nvfp4-check; NVFP4_BUDGET=45; NVFP4_TIMEOUT=75
    ATTN_BUDGET=30; ATTN_TIMEOUT=45; ATTN_FLAGS=""
    if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "device_check: no CUDA device visible to $PY (use --dry-run on a CPU)" >&2
        exit 2
    fi
fi

# 0. where the numbers come from
"$PY" - "$TARGET" > "$OUT/env.json" <<'PYEOF'
import json, platform, sys
import torch, triton, tilewright
from tilewright.runtime.targets import detect_target
dev = "cuda" if torch.cuda.is_available() and not sys.argv[1] else "cpu"
t = detect_target(dev)
print(json.dumps({"target": t.name, "arch": t.arch,
                  "device": torch.cuda.get_device_name() if dev == "cuda" else platform.machine(),
                  "torch": torch.__version__, "triton": triton.__version__,
                  "tilewright": tilewright.__version__, "cuda": torch.version.cuda,
                  "python": platform.python_version()}, indent=1))
PYEOF
[ $? -eq 0 ] || { echo "device_check: $PY cannot import torch, triton and tilewright" >&2; exit 2; }
ARCH="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["arch"])' "$OUT/env.json")"
echo "device_check: $(tr -d '\n ' < "$OUT/env.json")"

# 1. correctness, GPU part
echo "== 1/3 GPU tests (pytest -m gpu, timeout ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -m gpu -p no:cacheprovider -p no:randomly \
    --junitxml="$OUT/gpu_tests.xml" tests > "$OUT/gpu_tests.log" 2>&1
RC_TESTS=$?
tail -n 3 "$OUT/gpu_tests.log"

# 1b. the attention rows (a row starts only within ATTN_BUDGET s)
echo "== 1b attention rows (bench/attention_check.py, budget ${ATTN_BUDGET}s)"
timeout "$ATTN_TIMEOUT" "$PY" bench/attention_check.py "$OUT/attention.json" $ATTN_FLAGS \
    --budget-s "$ATTN_BUDGET" > "$OUT/attention.log" 2>&1
RC_ATTN=$?
tail -n 9 "$OUT/attention.log"

# 1c. Helion templates competing with the jinja Triton ones (JSON rows: winner, best ms per language)
echo "== 1c Helion templates (bench/helion_check.py, timeout ${HELION_TIMEOUT}s)"
timeout "$HELION_TIMEOUT" "$PY" bench/helion_check.py "$OUT/helion.json" ${TARGET:+--dry-run} \
    > "$OUT/helion.log" 2>&1
RC_HELION=$?
grep '^helion_check' "$OUT/helion.log"

# 2. the bench suite (starts no new problem after BENCH_BUDGET s; the JSON is kept up to date)
echo "== 2/3 bench run --suite $SUITE (budget ${BENCH_BUDGET}s)"
timeout "$BENCH_TIMEOUT" "$PY" -m tilewright bench run --suite "$SUITE" ${TARGET:+--target "$TARGET"} \
    --out "$OUT/bench.json" --time-budget-s "$BENCH_BUDGET" > "$OUT/bench.log" 2>&1
RC_BENCH=$?
tail -n 2 "$OUT/bench.log"
if [ -n "$NVFP4_SUITE" ]; then
    echo "== 2/3 bench run --suite $NVFP4_SUITE (budget ${NVFP4_BUDGET}s)"
    timeout "$NVFP4_TIMEOUT" "$PY" -m tilewright bench run --suite "$NVFP4_SUITE" \
        --out "$OUT/bench_nvfp4.json" --time-budget-s "$NVFP4_BUDGET" > "$OUT/bench_nvfp4.log" 2>&1
    RC_NVFP4=$?
    tail -n 2 "$OUT/bench_nvfp4.log"
    [ "$RC_NVFP4" -eq 0 ] || RC_BENCH=$RC_NVFP4
fi

# 3. the gate, when a baseline for this arch and suite is committed
RC_GATE=0
if [ -f "bench/baselines/$ARCH/$SUITE.json" ] && [ -f "$OUT/bench.json" ]; then
    echo "== 3/3 bench compare against bench/baselines/$ARCH/$SUITE.json"
    "$PY" -m tilewright bench compare bench/baselines "$OUT/bench.json" \
        --png "$OUT/speedup.png" > "$OUT/compare.log" 2>&1
    RC_GATE=$?
    tail -n 1 "$OUT/compare.log"
else
    echo "== 3/3 no baseline at bench/baselines/$ARCH/$SUITE.json: gate skipped" \
         "(to record one: cp $OUT/bench.json bench/baselines/$ARCH/$SUITE.json)"
fi

"$PY" - "$OUT" "$RC_TESTS" "$RC_BENCH" "$RC_GATE" "$RC_ATTN" "$(( $(date +%s) - START ))" "$RC_HELION" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, rc_tests, rc_bench, rc_gate, rc_attn, seconds, rc_helion = sys.argv[1], *map(int, sys.argv[2:])
tests = {}
try:
    suite = ET.parse(Path(out) / "gpu_tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except (OSError, ET.ParseError, IndexError):
    pass
summary = {"seconds": seconds, "gpu_tests": tests,
           "rc": {"tests": rc_tests, "helion": rc_helion, "bench": rc_bench, "gate": rc_gate,
                  "attention": rc_attn}}
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=1))
print("device_check summary:", json.dumps(summary))
PYEOF

# the tables, last
if [ -f "$OUT/bench.json" ]; then
    "$PY" -m tilewright bench show "$OUT/bench.json"
fi
if [ -f "$OUT/bench_nvfp4.json" ]; then
    "$PY" -m tilewright bench show "$OUT/bench_nvfp4.json"
fi
[ "$RC_TESTS" -eq 0 ] && [ "$RC_HELION" -eq 0 ] && [ "$RC_BENCH" -eq 0 ] && [ "$RC_GATE" -eq 0 ] && [ "$RC_ATTN" -eq 0 ]

#!/usr/bin/env bash
# The GPU check: one run of under 8 minutes on a GPU machine that has only its own torch/triton
# (the lent H100/H200: torch 2.11, triton 3.6, no helion). Its parts, in order of value, each
# with a time limit, each writing its JSON as it goes (a run cut short still reports):
#   gemm_bf16     bench suite h200-check: Llama-3-8B / Qwen3-30B-A3B layers, bf16 decode and
#                 prefill M, tilewright's choice vs ATen (cuBLAS) and Inductor max-autotune
#   gemm_nvfp4    bench suite nvfp4-check: the same dense layers as NVFP4 W4A4 GEMMs at M = 1,
#                 16, 64 vs ATen's dequantised matmul, and Llama-3-8B's at M = 16 as MXFP8
#                 (what a block-scaled F.scaled_mm lowers to; docs/low-precision.md)
#   attention     bench/attention_check.py: prefill, backward, decode, flex vs SDPA (flash)
#   llama_decode  bench/llama_decode_check.py: a tiny Llama decode step end to end vs Inductor
#                 (launches per step, ms per step)
#   decode        bench suite decode: a tiny Llama decode step (static KV cache of 256 positions),
#                 eager vs tilewright vs Inductor, each also under CUDA graphs (reduce-overhead)
#   gpu_tests     pytest -m gpu: the correctness suite's GPU part
#   helion        bench/helion_check.py: the Helion templates against the jinja Triton ones (last:
#                 measured on the CPU, the carried helion 1.5.1 cannot bind under torch 2.11,
#                 see bench/prepare_wheels.sh, and the table then says no Helion candidate ran)
# then the gate against bench/baselines/<arch>/<suite>.json for each bench suite that has one,
# and one table (bench/device_report.py).
#
# usage: bench/device_check.sh OUT_DIR [--dry-run]
#   --dry-run: the same parts on the CPU at toy sizes (what CI runs, under the GPU machine's
#   versions: make compat-smoke)
# env: PYTHON (default python3), TILEWRIGHT_CACHE_DIR (default: a fresh folder under /tmp),
#      DEVICE_CHECK_WORK (the parts' raw files and logs; default a fresh folder under /tmp),
#      DEVICE_CHECK_PARTS (only these parts, comma-separated)
#
# OUT_DIR receives few files (the device tool brings back at most 8): check.json (every part's
# results, rewritten after each part), check.log (every part's log), table.txt, and
# baselines/<arch>/<suite>.json (what to commit as the next run's baseline).
#
# Nothing is installed in the interpreter: tilewright runs from this checkout through
# PYTHONPATH with the machine's own torch and triton. Wheels in .whl/ (bench/prepare_wheels.sh:
# helion) are unpacked into a folder of their own and put on PYTHONPATH.
#
# To add a part: one `part NAME TIMEOUT_S COMMAND...` line below (the command writes
# "$WORK/NAME.json"); its time counts against the 8 minutes.
set -uo pipefail

OUT="${1:?usage: bench/device_check.sh OUT_DIR [--dry-run]}"
MODE="${2:-}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${DEVICE_CHECK_WORK:-$(mktemp -d /tmp/tilewright-check-work.XXXXXX)}"
mkdir -p "$WORK"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEWRIGHT_CACHE_DIR="${TILEWRIGHT_CACHE_DIR:-$(mktemp -d /tmp/tilewright-check.XXXXXX)}"
START=$(date +%s)
: > "$OUT/check.log"

if compgen -G "$REPO/.whl/*.whl" > /dev/null; then
    SITE="${DEVICE_CHECK_SITE:-/tmp/tilewright-site}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$REPO"/.whl/*.whl >> "$OUT/check.log" 2>&1 \
        && export PYTHONPATH="$PYTHONPATH:$SITE" \
        && echo "device_check: wheels from .whl/ unpacked into $SITE: $(cd "$REPO/.whl" && ls *.whl | tr '\n' ' ')"
fi

if [ "$MODE" = "--dry-run" ]; then
    DRY=--dry-run; TARGET_FLAGS=(--target cpu); GEMM_SUITE=tiny; GEMM_FLAGS=()
    SKIP_NVFP4="dry run: the Triton interpreter cannot run NVFP4 GEMMs"
    T_GEMM=180; T_NVFP4=0; T_ATTN=150; T_LLAMA=240; T_HELION=300; T_TESTS=300; T_DECODE=240
    B_GEMM=60; B_ATTN=60
else
    DRY=""; TARGET_FLAGS=(); GEMM_SUITE=h200-check; GEMM_FLAGS=(--inductor); SKIP_NVFP4=""
    # the limits add up to 450 s; with the start (imports, wheels: ~15 s) and the reports the
    # run stays under 8 minutes even when every part runs to its limit (limits set by value, not
    # yet measured on a GPU: llama_decode and decode share the step's compile cost, helion last)
    T_GEMM=110; T_NVFP4=55; T_ATTN=55; T_LLAMA=50; T_HELION=30; T_TESTS=100; T_DECODE=50
    B_GEMM=85; B_ATTN=30
    if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "device_check: no CUDA device visible to $PY (use --dry-run on a CPU)" >&2
        exit 2
    fi
fi

# where the numbers come from
"$PY" - "$DRY" > "$WORK/env.json" <<'PYEOF'
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
echo "device_check: $(tr -d '\n ' < "$WORK/env.json")"

report() {  # merge what the parts wrote so far into OUT (check.json, baselines/)
    "$PY" bench/device_report.py "$WORK" "$OUT" "$@"
}

# part NAME TIMEOUT_S COMMAND...: run COMMAND under the limit, log it, record its exit code and
# seconds, and merge what it wrote into OUT/check.json at once (TIMEOUT_S 0: skipped, for the
# reason in $SKIP)
part() {
    local name="$1" limit="$2"; shift 2
    if [ -n "${DEVICE_CHECK_PARTS:-}" ] && [[ ",$DEVICE_CHECK_PARTS," != *",$name,"* ]]; then return; fi
    if [ "$limit" -le 0 ]; then
        printf '{"part": "%s", "rc": 0, "seconds": 0, "limit_s": 0, "skipped": "%s"}\n' \
            "$name" "${SKIP:-no time given}" >> "$WORK/parts.jsonl"
        return
    fi
    echo "== $name (limit ${limit}s, at $(( $(date +%s) - START ))s)"
    local t0=$(date +%s)
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    printf '{"part": "%s", "rc": %d, "seconds": %d, "limit_s": %d}\n' \
        "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$WORK/parts.jsonl"
    { echo "===== $name (rc $rc)"; cat "$WORK/$name.log"; } >> "$OUT/check.log"
    tail -n 2 "$WORK/$name.log"
    report --quiet
}

BENCH=("$PY" -m tilewright bench run "${TARGET_FLAGS[@]}")
part gemm_bf16    "$T_GEMM"   "${BENCH[@]}" --suite "$GEMM_SUITE" "${GEMM_FLAGS[@]}" --time-budget-s "$B_GEMM" --out "$WORK/gemm_bf16.json"
SKIP="$SKIP_NVFP4" \
part gemm_nvfp4   "$T_NVFP4"  "${BENCH[@]}" --suite nvfp4-check --time-budget-s 40 --out "$WORK/gemm_nvfp4.json"
part attention    "$T_ATTN"   "$PY" bench/attention_check.py "$WORK/attention.json" $DRY --budget-s "$B_ATTN"
part llama_decode "$T_LLAMA"  "$PY" bench/llama_decode_check.py "$WORK/llama_decode.json" $DRY
part decode       "$T_DECODE" "${BENCH[@]}" --suite decode --cases decode.llama.step --out "$WORK/decode.json"
# only the files that hold gpu tests: collecting the whole suite costs a minute
part gpu_tests    "$T_TESTS"  "$PY" -m pytest -q -rA -m gpu -p no:cacheprovider -p no:randomly \
                                  --junitxml="$WORK/gpu_tests.xml" $(grep -l 'mark\.gpu' tests/test_*.py)
part helion       "$T_HELION" "$PY" bench/helion_check.py "$WORK/helion.json" $DRY

# the gate, then the table (last), and the exit code: 0 when every part and gate passed
report --gate --seconds "$(( $(date +%s) - START ))"

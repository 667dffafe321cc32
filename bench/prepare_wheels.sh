#!/usr/bin/env bash
# Fill .whl/ (ignored by git) with the wheels bench/device_check.sh unpacks on the GPU machine,
# which has no package index and none of these packages (its own: Python 3.12, torch 2.11,
# triton 3.6, numpy, scikit-learn, psutil, rich, ...). The device tool carries .whl/ with the
# tree (64 MiB in all, the tree included), so only what fits goes:
#   helion 1.5.1 (4.5 MiB) and filecheck (its one need the machine lacks): the Helion templates.
#   Measured on the CPU under the machine's torch 2.11 / triton 3.6: 1.5.1 binds no template
#   (it imports IntelGPUError from torch._inductor.runtime.triton_compat, which 2.11 lacks) and
#   1.4.0 fails to lower the templates' reductions: device_check's helion row then says so.
#   nvidia-cutlass-dsl 4.8.1 (CuTeDSL) does NOT go: its CUDA library wheel alone
#   (nvidia-cutlass-dsl-libs-cu13, or -cu12) is 88 MiB, over the whole 64 MiB; the CuTeDSL
#   templates report "nvidia-cutlass-dsl is not installed" there and are skipped.
#
# usage: bench/prepare_wheels.sh            (then carry .whl: run(carry=[".whl"], ...))
# env: PYTHON (default python3; any version: pip downloads cp312 manylinux wheels)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-python3}"
WHEELS=(helion==1.5.1 filecheck==1.0.6)
rm -rf .whl
mkdir -p .whl
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${WHEELS[@]}" 2>&1 | grep -v '^WARNING: Location' || true
ls .whl/*.whl > /dev/null  # fails when pip downloaded nothing
WHL_KB=$(du -sk .whl | cut -f1)
TREE_KB=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n 1 | cut -f1)
echo "prepare_wheels: $(ls .whl | tr '\n' ' ')"
echo "prepare_wheels: .whl ${WHL_KB} KiB + tracked tree ${TREE_KB} KiB of the 65536 KiB the device tool carries"
if [ $(( WHL_KB + TREE_KB )) -gt 65536 ]; then
    echo "prepare_wheels: over the 64 MiB limit: the call would be refused" >&2
    exit 1
fi

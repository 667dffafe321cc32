"""Optional ranking from NVIDIA's nvMatmulHeuristics (``pip install nvidia-matmul-heuristics``).

When the package is installed, its predicted-best CTA tiles, stage counts and split-K for a
GEMM on a known GPU seed the policy ahead of tilewright's own decode variants (the policy keeps
the total within its budget). Facts of the package, measured: queries work without a GPU
(~1 ms); results are not sorted (we sort by its runtime estimate); its precision string is not
validated (an unknown letter gives made-up tiles or zeros), so only the strings of its header's
list are used: one letter per type, ``T`` bf16 (``B`` is *uint8*), ``H`` fp16, ``S`` fp32, ``Q``
e4m3, ``O`` fp4; five letters are A, B, C, compute, D. ``estimateSiliconMetric`` crashes the
process, so it is never called. The interface object lives for the whole process.

Block-scaled formats (measured, nvidia-matmul-heuristics 0.1.0.27, B200, TRITON backend, a
4096x4096 weight): ``OOTST`` (fp4 x fp4 → bf16) answers 2-4 configurations, 16x32x128 and
16x32x256 for M <= 16, 64x32x128 at M = 64, 128x32x128 / 64x64x128 at M = 128; the block
scales are not part of its model, so its fp4 answers stand for NVFP4 and MXFP4 alike and
``QQTST`` (e4m3) for MXFP8. Queried in both orientations: the swapped problem's answers come
back as swap-AB settings.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target

log = logging.getLogger("tilewright.autotune")

_GPU = {"cuda:sm_90a": "H200_SXM", "cuda:sm_100a": "B200"}
# (A and B dtype, output dtype) -> precision string (3 letters: A/B, compute, C/D; 5: A, B, C,
# compute, D); "BSB" would be uint8 x uint8 (the mapping tilewright used before 2026-12)
_PRECISION = {("bf16", "bf16"): "TST", ("bf16", "fp32"): "TSS", ("fp16", "fp16"): "HSH",
              ("fp16", "fp32"): "HSS", ("fp32", "fp32"): "SSS",
              ("nvfp4", "bf16"): "OOTST", ("nvfp4", "fp16"): "OOHSH", ("nvfp4", "fp32"): "OOSSS",
              ("mxfp4", "bf16"): "OOTST", ("mxfp4", "fp16"): "OOHSH", ("mxfp4", "fp32"): "OOSSS",
              ("mxfp8", "bf16"): "QQTST", ("mxfp8", "fp32"): "QQSSS"}
# (A layout, B layout) -> the package's row-major layout name: N = as stored, T = transposed
_LAYOUT = {("row", "row"): "NN_ROW_MAJOR", ("row", "col"): "NT_ROW_MAJOR",
           ("col", "row"): "TN_ROW_MAJOR", ("col", "col"): "TT_ROW_MAJOR"}


@functools.lru_cache(maxsize=None)
def _interface(gpu: str):
    import nvMatmulHeuristics as nvmmh

    return nvmmh, nvmmh.NvMatmulHeuristicsInterfaceEx(
        backend=nvmmh.NvMatmulHeuristicsTarget.TRITON, gpu=getattr(nvmmh.NvMatmulHeuristicsNvidiaGpu, gpu))


def available() -> bool:
    try:
        import nvMatmulHeuristics  # noqa: F401
    except ImportError:
        return False
    return True


def precision_of(problem: GemmProblem) -> str | None:
    """The package's precision string for ``problem`` (None: not one it models)."""
    return _PRECISION.get((problem.dtype, problem.out_dtype))


def heuristic_params(problem: GemmProblem, target: Target, count: int = 8, *,
                     swapped: bool | None = None) -> list[dict[str, Any]]:
    """Up to ``count`` parameter settings (BLOCK_M/N/K, num_warps, num_stages, SPLIT_K) the
    package ranks best for ``problem`` on ``target``, best first; [] when it cannot answer.
    ``swapped=True`` asks about C^T = B^T A^T and returns SWAP_AB settings (tiles of the
    swapped problem); the default asks both orientations for block-scaled problems (whose
    kernels are symmetric in their operands), the problem's own otherwise."""
    if swapped is None:
        if problem.block_scaled and not problem.batched:
            return (heuristic_params(problem, target, count, swapped=False)
                    + heuristic_params(problem, target, count, swapped=True))
        swapped = False
    kp = problem.transposed() if swapped else problem
    gpu, precision = _GPU.get(target.name), precision_of(problem)
    layout = _LAYOUT.get((kp.layout_a, kp.layout_b))
    if gpu is None or precision is None or layout is None or problem.batched or not available():
        return []
    try:
        nvmmh, h = _interface(gpu)
        query = h.makeNvMatmulHeuristicsProblem(kp.M, kp.N, kp.K,
                                                getattr(nvmmh.NvMatmulHeuristicsMatmulLayout, layout))
        results = sorted(h.get(query, count, precision=precision), key=lambda r: r["runtime"])
    except Exception as e:  # noqa: BLE001 - an optional advisor must never break tuning
        log.info("nvMatmulHeuristics gave no answer for %s: %s", problem.describe(), e)
        return []
    out = []
    for r in results:
        if not r["kernel"].cta_tile_m or r["runtime"] <= 0:
            continue  # the package's placeholder rows (seen for unknown precisions)
        k = r["kernel"]
        warps = max(1, (k.cta_tile_m // max(k.warp_tile_m or k.cta_tile_m, 1))
                    * (k.cta_tile_n // max(k.warp_tile_n or k.cta_tile_n, 1)))
        out.append({"BLOCK_M": k.cta_tile_m, "BLOCK_N": k.cta_tile_n, "BLOCK_K": k.cta_tile_k,
                    "GROUP_M": 8, "num_warps": 1 << (min(warps, 8).bit_length() - 1),
                    "num_stages": max(1, min(k.stages or 3, 6)), "SPLIT_K": k.split_k or 1,
                    "SWAP_AB": swapped})
    return out

"""Optional ranking from NVIDIA's nvMatmulHeuristics (``pip install nvidia-matmul-heuristics``).

When the package is installed, its predicted-best CTA tiles, stage counts and split-K for a
GEMM on a known GPU seed the policy ahead of tilewright's own decode variants (the policy keeps
the total within its budget). Facts of the package, measured: queries work without a GPU
(~1 ms); results are not sorted (we sort by its runtime estimate); its precision string is not
validated (we map only bf16/fp16/fp32); ``estimateSiliconMetric`` crashes the process, so it is
never called. The interface object lives for the whole process.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target

log = logging.getLogger("tilewright.autotune")

_GPU = {"cuda:sm_90a": "H200_SXM", "cuda:sm_100a": "B200"}
_PRECISION = {"bf16": "BSB", "fp16": "HSH", "fp32": "SSS"}
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


def heuristic_params(problem: GemmProblem, target: Target, count: int = 8) -> list[dict[str, Any]]:
    """Up to ``count`` parameter settings (BLOCK_M/N/K, num_warps, num_stages, SPLIT_K) the
    package ranks best for ``problem`` on ``target``, best first; [] when it cannot answer."""
    gpu, precision = _GPU.get(target.name), _PRECISION.get(problem.dtype)
    layout = _LAYOUT.get((problem.layout_a, problem.layout_b))
    if gpu is None or precision is None or layout is None or problem.batched or not available():
        return []
    try:
        nvmmh, h = _interface(gpu)
        query = h.makeNvMatmulHeuristicsProblem(problem.M, problem.N, problem.K,
                                                getattr(nvmmh.NvMatmulHeuristicsMatmulLayout, layout))
        results = sorted(h.get(query, count, precision=precision), key=lambda r: r["runtime"])
    except Exception as e:  # noqa: BLE001 - an optional advisor must never break tuning
        log.info("nvMatmulHeuristics gave no answer for %s: %s", problem.describe(), e)
        return []
    out = []
    for r in results:
        k = r["kernel"]
        warps = max(1, (k.cta_tile_m // max(k.warp_tile_m or k.cta_tile_m, 1))
                    * (k.cta_tile_n // max(k.warp_tile_n or k.cta_tile_n, 1)))
        out.append({"BLOCK_M": k.cta_tile_m, "BLOCK_N": k.cta_tile_n, "BLOCK_K": k.cta_tile_k,
                    "GROUP_M": 8, "num_warps": 1 << (min(warps, 8).bit_length() - 1),
                    "num_stages": max(1, min(k.stages or 3, 6)), "SPLIT_K": k.split_k or 1,
                    "SWAP_AB": False})
    return out

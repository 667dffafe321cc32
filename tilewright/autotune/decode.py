"""Decode-shape variants (M <= 64): thin tiles, swap-AB, split-K.

A decode GEMM (a few tokens against a large weight) has little M and much N and K. Three
remedies, each added only where the shape calls for it:

* **swap-AB** (N >= 4 M and N >= 256): compute C^T = B^T A^T, so N fills the MMA's M side
  (wgmma and tcgen05 need 64 rows; M = 1..16 would waste most of each instruction);
* **split-K** (K >= 1024 and the output has fewer tiles than half the SMs): give each tile's K
  range to several programs so enough SMs pull the weight through; an fp32 reduction follows;
* **thin tiles**: BLOCK_M clamped to M (at least 16).
"""

from __future__ import annotations

from typing import Any

from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target

SPLITS = (2, 4, 8, 16)
MIN_K_PER_SPLIT = 256


def wants_swap_ab(problem: GemmProblem) -> bool:
    return not problem.batched and problem.N >= 256 and problem.N >= 4 * problem.M


def wants_split_k(problem: GemmProblem, target: Target, block_m: int, block_n: int) -> bool:
    tiles = -(-problem.M // block_m) * -(-problem.N // block_n)
    return not problem.batched and problem.K >= 1024 and tiles < max(target.num_sms // 2, 1)


def split_for(problem: GemmProblem, target: Target, block_m: int, block_n: int) -> int:
    """The smallest split that brings the program count to about one wave of SMs."""
    tiles = -(-problem.M // block_m) * -(-problem.N // block_n)
    for s in SPLITS:
        if tiles * s >= target.num_sms or problem.K // (s * 2) < MIN_K_PER_SPLIT:
            return s
    return SPLITS[-1]


def _pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def decode_variants(problem: GemmProblem, target: Target, knobs: set[str]) -> list[dict[str, Any]]:
    """Swap-AB and split-K settings for a template whose space has those knobs (unchecked:
    the caller filters with the template's ``check``)."""
    out: list[dict[str, Any]] = []
    thin = _pow2(problem.M)
    stages = 2 if target.backend == "hip" else 4
    base: list[dict[str, Any]] = [
        {"BLOCK_M": min(thin, 64), "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4, "num_warps": 4,
         "num_stages": stages, "SWAP_AB": False}
        for bn, bk in ((64, 128), (128, 128), (128, 64))]
    if "SWAP_AB" in knobs and wants_swap_ab(problem):
        # the kernel's M is the problem's N: 64/128-row tiles of it, BLOCK_N covers the tokens
        base += [{"BLOCK_M": bm, "BLOCK_N": min(thin, 64), "BLOCK_K": bk, "GROUP_M": 8,
                  "num_warps": 4, "num_stages": stages, "SWAP_AB": True}
                 for bm, bk in ((64, 128), (128, 128), (128, 64))]
    for p in base:
        p["SPLIT_K"] = 1
        out.append(p)
        if "SPLIT_K" not in knobs:
            continue
        kp = problem.transposed() if p["SWAP_AB"] else problem
        if wants_split_k(kp, target, p["BLOCK_M"], p["BLOCK_N"]):
            out.append({**p, "SPLIT_K": split_for(kp, target, p["BLOCK_M"], p["BLOCK_N"])})
    return out

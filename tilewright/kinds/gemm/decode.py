"""Decode-shape variants (M <= 64; block-scaled GEMMs on Blackwell up to M = 128): thin tiles,
swap-AB, split-K.

A decode GEMM (a few tokens against a large weight) has little M and much N and K. Three
remedies, each added only where the shape calls for it:

* **swap-AB** (N >= 4 M and N >= 256): compute C^T = B^T A^T, so N fills the MMA's M side
  (wgmma and tcgen05 need 64 rows; M = 1..16 would waste most of each instruction);
* **split-K** (K >= 1024 and the output has fewer tiles than half the SMs): give each tile's K
  range to several programs so enough SMs pull the weight through; an fp32 reduction follows;
* **thin tiles**: BLOCK_M clamped to M (at least 16).

Block-scaled GEMMs (NVFP4, MX) get their own bounded list (:func:`blockscaled_variants`): a
few tiles per orientation with deep K steps (a K step of 256 packed values is 128 bytes, one
TMA line), where Blackwell's block-scaled MMA wants 128 rows: swapped, the weight's N fills
them and the tokens take a 16-64-column tile. They count as decode up to M = 128 on chips with
tcgen05 (a 128-row tile of tokens is one MMA there), up to 64 elsewhere.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target

SPLITS = (2, 4, 8, 16)
MIN_K_PER_SPLIT = 256


def wants_swap_ab(problem: GemmProblem, min_n: int = 256) -> bool:
    """N is wide and M thin enough that C^T = B^T A^T fills the MMA better (block-scaled
    GEMMs pass ``min_n=128``: their MMA tile is 128 rows, so N = 128 already fills one)."""
    return not problem.batched and problem.N >= min_n and problem.N >= 4 * problem.M


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


def decode_limit(problem: GemmProblem, target: Target) -> int:
    """The M up to which a problem gets the decode variants on ``target``."""
    if problem.block_scaled and target.has("tcgen05"):
        return 128
    return 64


# (BLOCK_M or BLOCK_N of the weight's side, BLOCK_K): per orientation, the few tiles a
# block-scaled decode GEMM is tried with besides the heuristic pool
BLOCKSCALED_TILES = ((128, 256), (128, 128), (64, 256), (64, 128))  # the last: the dequantising
# template's (its wider tiles spill on NVIDIA: templates/triton/registers.py)


def blockscaled_variants(problem: GemmProblem, target: Target, knobs: set[str]) -> list[dict[str, Any]]:
    """The bounded decode list of a block-scaled GEMM: per orientation (plain, and swap-AB when
    the template has it and N >= 4 M) the tiles of :data:`BLOCKSCALED_TILES`, the tokens' side
    thin (M rounded up to 16..64), each also with the split-K that brings the grid to a wave
    when the shape calls for it. At most 16 settings (unchecked: the caller filters)."""
    thin = min(_pow2(problem.M), 64)
    warps = 4
    stages = 2 if target.backend == "hip" else 3
    out: list[dict[str, Any]] = []
    orientations = [False] + ([True] if "SWAP_AB" in knobs and wants_swap_ab(problem, 128) else [])
    for swap in orientations:
        for wide, bk in BLOCKSCALED_TILES:
            bm, bn = (wide, thin) if swap else (min(_pow2(problem.M), 128), wide)
            p = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8 if swap else 4,
                 "num_warps": warps if bm * bn >= 64 * 64 else 4, "num_stages": stages,
                 "SWAP_AB": swap, "SPLIT_K": 1}
            out.append(p)
            kp = problem.transposed() if swap else problem
            if "SPLIT_K" in knobs and wants_split_k(kp, target, bm, bn):
                out.append({**p, "SPLIT_K": split_for(kp, target, bm, bn)})
    return out


def decode_variants(problem: GemmProblem, target: Target, knobs: set[str]) -> list[dict[str, Any]]:
    """Swap-AB and split-K settings for a template whose space has those knobs (unchecked:
    the caller filters with the template's ``check``); block-scaled problems get
    :func:`blockscaled_variants`."""
    if problem.block_scaled:
        return blockscaled_variants(problem, target, knobs)
    out: list[dict[str, Any]] = []
    thin = _pow2(problem.M)
    stages = 2 if target.backend == "hip" else 4
    base: list[dict[str, Any]] = [
        {"BLOCK_M": min(thin, 64), "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4, "num_warps": 4,
         "num_stages": stages, "SWAP_AB": False}
        for bn, bk in ((64, 128), (128, 128), (128, 64))]
    if "SWAP_AB" in knobs and wants_swap_ab(problem):
        # the kernel's M is the problem's N: 64/128-row tiles of it, BLOCK_N covers the tokens
        # (64, 64): the smallest, the one tile the register check lets through on sm_90a at
        # M = 64 (the others spill: templates/triton/registers.py)
        base += [{"BLOCK_M": bm, "BLOCK_N": min(thin, 64), "BLOCK_K": bk, "GROUP_M": 8,
                  "num_warps": 4, "num_stages": stages, "SWAP_AB": True}
                 for bm, bk in ((64, 128), (128, 128), (128, 64), (64, 64))]
    for p in base:
        p["SPLIT_K"] = 1
        out.append(p)
        if "SPLIT_K" not in knobs:
            continue
        kp = problem.transposed() if p["SWAP_AB"] else problem
        if wants_split_k(kp, target, p["BLOCK_M"], p["BLOCK_N"]):
            out.append({**p, "SPLIT_K": split_for(kp, target, p["BLOCK_M"], p["BLOCK_N"])})
    return out


def aot_remedies(problem: Any, target: Target, ranked: list[tuple[float, dict[str, Any]]],
                 chosen: list[tuple[float, dict[str, Any]]]) -> list[tuple[float, dict[str, Any]]]:
    """What ``tilewright aot`` builds of one template for ``problem``: ``chosen`` plus, for a
    block-scaled decode GEMM, the best-ranked swap-AB and split-K settings when none is chosen
    yet. Which remedy helps is only known once measured on the device (the JIT tuner gives each
    a slot for the same reason), so an ahead-of-time build carries them."""
    if not getattr(problem, "block_scaled", False) or problem.M > decode_limit(problem, target):
        return chosen
    out = list(chosen)
    for remedy in (lambda p: p.get("SWAP_AB") is True, lambda p: p.get("SPLIT_K", 1) > 1):
        if not any(remedy(p) for _, p in out):
            best = next(((ms, p) for ms, p in ranked if remedy(p)), None)
            if best is not None:
                out.append(best)
    return out

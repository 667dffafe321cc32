"""Registers a Triton GEMM tile needs per thread, and whether it spills: the estimate the GEMM
templates refuse tiles with and the cost model charges occupancy with.

Calibrated on ahead-of-time builds (``bench/register_calibration.py`` compiles the policy's
tiles for sm_90a, sm_100a, gfx950 and gfx1250 and reads registers and spills from each
artifact, :mod:`tilewright.runtime.resources`; the data is ``bench/register_calibration.json``,
the table below is generated from it). For a tile the calibration compiled, the estimate is what
the compiler did: its registers, and whether it spilled. For any other tile it is a linear fit
on the calibration's non-spilling tiles of the same template and chip,
``c0 + c_acc * (accumulator values per thread) + c_ops * (A and B tile values per thread per
K step)``, checked against the chip's budget.

Measured facts that shaped it (triton 3.9): the pointer GEMM (``triton.gemm``) with a weight
stored (N, K) spills on NVIDIA for most tiles beyond 16x32x128 with one warp or 32x64x128 with
two, and ptxas's allocation there follows no fit (32 or 64 registers with 5-15 KB of spills, or
255 with spills): on NVIDIA with B stored (N, K) only tiles no larger than a calibrated
non-spilling one with the same warps pass (measured in the demo Llama's AOT build: 32x32x128
with one warp and 16x128x64 with two, both uncalibrated, spill ~5-6 KB); 16x32x256 with one warp spills
on every target (sm_90a/sm_100a ~8.5 KB of spill stores, gfx950 310 VGPRs, gfx1250 405); the
descriptor GEMM (``triton.gemm_tma``) spills nowhere in the grid (TMA/TDM write shared memory
directly); gfx1250 allocates up to 1024 VGPRs before it spills, gfx950 512 (256 + 256 AGPRs).
"""

from __future__ import annotations

from typing import Any

from tilewright.runtime.targets import Target
from tilewright.templates.triton.register_table import FITS, MEASURED

# registers per thread a kernel may use before the compiler spills
BUDGETS = {"cuda": 255, "gfx950": 512, "gfx942": 512, "gfx1250": 1024}
# templates whose register use the table models, by the table's name for them
MODELLED = ("triton.gemm", "triton.gemm_tma", "triton.gemm_nvfp4")
SYMMETRIC = ("triton.gemm_nvfp4",)
# a calibrated tile vouches only for its own problem when it used more than this share of the
# budget: near the edge another problem's masks and epilogue tip ptxas into spilling (sm_90a's
# 16x32x128 one-warp pointer GEMM: 166 registers on the calibration's 512^3, 168 and 40 B of
# spill stores on an 8x512x128 lm_head)
EDGE = 0.6


def budget(target: Target) -> int | None:
    """Registers (VGPRs) per thread on ``target`` before spilling; None when unknown."""
    if target.backend == "cuda":
        return BUDGETS["cuda"]
    return BUDGETS.get(target.arch)


def features(params: Any, target: Target) -> tuple[float, float]:
    """(accumulator values per thread, A and B tile values per thread per K step)."""
    threads = params["num_warps"] * target.warp_size
    acc = params["BLOCK_M"] * params["BLOCK_N"] / threads
    ops = (params["BLOCK_M"] + params["BLOCK_N"]) * params["BLOCK_K"] / threads
    return acc, ops


def estimate(template_id: str, params: Any, target: Target, layout_b: str = "") -> tuple[float, bool] | None:
    """(registers per thread, whether it spills) for a tile of ``template_id`` on ``target``;
    None for a template or chip the calibration does not cover. ``layout_b`` is the kernel's B
    layout: the calibration's weights are stored (N, K), "col"."""
    key = (target.arch, template_id)
    tile = (params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"])
    table = MEASURED.get(key, {})
    # the NVFP4 kernel is symmetric in its operands (both rows of packed K): a 64x16 tile is a
    # 16x64 one (measured on sm_100a: 64x16x256 with four warps spills as 16x64x256 does)
    shapes = [tile] + ([(tile[1], tile[0], tile[2], tile[3])] if template_id in SYMMETRIC else [])
    for shape in shapes:
        if shape in table:
            regs, spilled = table[shape]
            if not spilled and at_the_edge(template_id, target, layout_b, params, regs):
                return float(regs), True
            return float(regs), bool(spilled)
    # with the same warps, a tile no smaller than one that spilled spills too
    if any(spilled and m[3] == t[3] and all(a >= b for a, b in zip(t[:3], m[:3]))
           for m, (_, spilled) in table.items() for t in shapes):
        return float(budget(target) or 255) + 1.0, True
    if within_measured_only(template_id, target, layout_b, params) and key in MEASURED:
        # ptxas's allocation of these kernels follows no register count we can fit (it settles
        # on 32 or 64 registers and spills 5-15 KB, or 255 and spills): only tiles no larger
        # than one measured not to spill, with its warps, are taken as safe
        safe = any(not spilled and w == t[3] and all(a <= b for a, b in zip(t[:3], (bm, bn, bk)))
                   for (bm, bn, bk, w), (_, spilled) in MEASURED[key].items() for t in shapes)
        return (float(MEASURED[key].get(tile, (0, 0))[0]) or (budget(target) or 255) * (0.9 if safe else 1.1),
                not safe)
    # a chip the calibration has no fit for borrows one of the same vendor's (sm_100a's pointer
    # GEMM spilled in all but two tiles: too few to fit, so sm_90a's stands in)
    fit = FITS.get(key) or next((f for (arch, tid), f in sorted(FITS.items())
                                 if tid == template_id and arch[:3] == target.arch[:3]), None)
    limit = budget(target)
    if fit is None or limit is None:
        return None
    acc, ops = features(params, target)
    regs = fit[0] + fit[1] * acc + fit[2] * ops
    return regs, regs > limit


def within_measured_only(template_id: str, target: Target, layout_b: str, params: Any = None) -> bool:
    """Kernels whose registers only the calibration's own tiles vouch for: on NVIDIA, the pointer
    GEMM with B stored (N, K) and the NVFP4 dequantising GEMM (both hold a K step's operand
    fragments in registers; measured in the NVFP4 decode AOT build: the uncalibrated
    128x16x128 with four warps, which the fit passed, spilled 208 B on sm_100a). The pointer
    GEMM's swap-AB and split-K settings were not calibrated (another kernel shape): the fit
    judges them, so decode keeps its remedies until a calibration covers them."""
    if target.backend != "cuda":
        return False
    if template_id == "triton.gemm_nvfp4":
        return True  # symmetric: its swap-AB tiles are the calibrated ones transposed
    params = params or {}
    return (template_id == "triton.gemm" and layout_b == "col" and not params.get("SWAP_AB")
            and params.get("SPLIT_K", 1) == 1)


def at_the_edge(template_id: str, target: Target, layout_b: str, params: Any, regs: float) -> bool:
    """Whether a tile measured not to spill is still taken to spill on other problems: a pointer
    GEMM tile whose registers only the calibration vouches for (:func:`within_measured_only`)
    that used more than :data:`EDGE` of the budget. (The NVFP4 GEMM's one- and two-warp tiles
    sit at 183-194 registers and spilled on no decode problem measured, so the rule is not
    theirs.)"""
    limit = budget(target)
    return (template_id == "triton.gemm" and bool(limit) and regs > EDGE * limit
            and within_measured_only(template_id, target, layout_b, params))


def refusal(template_id: str, params: Any, target: Target, layout_b: str = "") -> str | None:
    """Why a tile is refused for its registers (None when it fits)."""
    est = estimate(template_id, params, target, layout_b)
    if est is None or not est[1]:
        return None
    tile = (params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"])
    table = MEASURED.get((target.arch, template_id), {})
    measured = table.get(tile) or (table.get((tile[1], tile[0], *tile[2:])) if template_id in SYMMETRIC else None)
    if measured is not None and not measured[1]:
        return (f"at the edge of spilling on {target.name}: measured at {measured[0]} of {budget(target)} "
                "registers in an AOT build, and other problems' masks and epilogues spill it "
                "(templates/triton/registers.py: EDGE)")
    if measured is not None:
        return (f"spills registers on {target.name} (measured in an AOT build: "
                "bench/register_calibration.json)")
    if any(spilled and m[3] == tile[3] and all(a >= b for a, b in zip(tile[:3], m[:3]))
           for m, (_, spilled) in table.items()):
        return (f"spills registers on {target.name}: a smaller tile with its warps spilled in an AOT "
                "build (bench/register_calibration.json)")
    if within_measured_only(template_id, target, layout_b, params):
        return (f"spills registers on {target.name} by the calibration: no tile measured not to spill "
                f"with {tile[3]} warp(s) covers it (ptxas spills this GEMM's fragments unpredictably)")
    return (f"needs ~{est[0]:.0f} registers per thread, over {target.name}'s {budget(target)} "
            "(estimate calibrated on AOT builds: templates/triton/registers.py)")


def occupancy_factor(template_id: str, params: Any, target: Target, layout_b: str = "") -> float:
    """How much slower the cost model takes a tile to be for its registers: 1 up to half the
    budget, rising to 1.25 at the budget (fewer programs per SM hide less latency), and 2 more
    per budget's worth over it (spills). The register counts are calibrated; the slope is a
    prior until a device measures it."""
    est = estimate(template_id, params, target, layout_b)
    limit = budget(target)
    if est is None or not limit:
        return 1.0
    frac = est[0] / limit
    factor = 1.0 + 0.5 * max(0.0, min(frac, 1.0) - 0.5)
    if est[1]:
        factor += 2.0 * max(frac - 1.0, 0.25)
    return factor

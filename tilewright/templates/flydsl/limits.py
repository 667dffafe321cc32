"""gfx950 budgets for the FlyDSL GEMM templates, and models of what a tile costs, checked
before anything compiles.

- LDS: 160 KiB per workgroup on gfx950 (CDNA4; :data:`tilewright.templates.flydsl.runtime.LDS_LIMIT`).
  :func:`lds_bytes` is what the kernels of ``gemm.py.jinja`` / ``grouped_gemm.py.jinja``
  allocate: one ``fx.SharedAllocator`` union of the K ring (``num_stages`` buffers of A and B
  tiles) and the fp32 tile the accumulator is staged through for the epilogue. It equals the
  compiled ``.amdhsa_group_segment_fixed_size`` exactly (tests/test_flydsl_gemm.py compiles
  and compares).
- VGPRs: FlyDSL 0.5.0 never allocates AGPRs (measured: ``.agpr_count 0`` on every kernel
  here), so a lane has 256 VGPRs, accumulators included. :func:`vgpr_estimate` counts the
  accumulator, the A/B fragments of one K slab and an overhead (addresses, loop state,
  epilogue temporaries) calibrated on compiled kernels; a tile over the budget would spill to
  scratch, which ``expected_instructions`` forbids.

MFMA 16x16x32 (bf16/fp16, wave64): per lane an A or B operand is 8 halves (4 VGPRs), the
16x16 fp32 product 4 VGPRs (CDNA4 ISA guide, "Matrix fused multiply-add").
"""

from __future__ import annotations

from tilewright.templates.flydsl.runtime import LDS_LIMIT

ARCH = "gfx950"
LDS_BYTES = LDS_LIMIT[ARCH]  # 160 KiB
VGPR_BUDGET = 256  # per lane; no AGPRs in FlyDSL 0.5.0
WAVE = 64  # lanes per wavefront
MFMA_M = MFMA_N = 16
MFMA_K = 32
VEC = 8  # halves per 128-bit global->LDS copy
# VGPRs beyond accumulator and fragments: buffer offsets, loop state, epilogue temporaries
# (and the grouped kernel's scan). Measured on compiled kernels (flydsl 0.5.0, gfx950;
# measured / accumulator + fragments): 128x128x64 w4 130/128, 128x256x64 w4 224/224,
# 256x128x64 w8 128/128, 64x128x64 w4 grouped 102/80, 64x64x64 w4 68/48, 64x128x32 w4 70/56,
# 32x64x128 w4 82/56, 64x64x64 w8 grouped 66/32. Small tiles pay ~20-34 more, big ones
# almost nothing (the allocator reuses registers once the accumulator dominates): the
# estimate adds max(8, 48 - core / 4), an upper bound on all of these.
VGPR_OVERHEAD_MAX, VGPR_OVERHEAD_MIN = 48, 8


def wave_grid(num_warps: int) -> tuple[int, int]:
    """How the waves tile the block: (waves along M, waves along N)."""
    return {4: (2, 2), 8: (4, 2)}[num_warps]


def lds_bytes(block_m: int, block_n: int, block_k: int, num_stages: int, element_bytes: int = 2) -> int:
    """LDS a workgroup allocates, bytes: max of the K ring and the fp32 accumulator tile (they
    share the allocation: the ring is dead once the K loop ends)."""
    ring = num_stages * (block_m + block_n) * block_k * element_bytes
    stage_c = block_m * block_n * 4
    return max(ring, stage_c)


def vgpr_estimate(block_m: int, block_n: int, block_k: int, num_warps: int) -> int:
    """VGPRs per lane the main loop needs (see the module docstring)."""
    wm, wn = wave_grid(num_warps)
    atoms_m = block_m // (MFMA_M * wm)
    atoms_n = block_n // (MFMA_N * wn)
    k_steps = block_k // MFMA_K
    core = atoms_m * atoms_n * 4 + (atoms_m + atoms_n) * k_steps * 4  # accumulator + fragments
    return core + max(VGPR_OVERHEAD_MIN, VGPR_OVERHEAD_MAX - core // 4)


def tile_refusal(p: dict, element_bytes: int = 2) -> str | None:
    """Why a (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, INTERLEAVE) setting cannot be
    built on gfx950, or None: waves not tiling the MFMA grid, copies not covering the tiles,
    LDS over 160 KiB, VGPRs over 256."""
    bm, bn, bk, w, s = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_warps"], p["num_stages"]
    wm, wn = wave_grid(w)
    if bm % (MFMA_M * wm) or bn % (MFMA_N * wn):
        return (f"{w} waves as {wm}x{wn} do not tile a {bm}x{bn} block with 16x16 MFMAs "
                f"(BLOCK_M must be a multiple of {MFMA_M * wm}, BLOCK_N of {MFMA_N * wn})")
    if bk % MFMA_K:
        return f"BLOCK_K={bk} is not a multiple of the MFMA depth {MFMA_K}"
    threads = w * WAVE
    rows = threads * VEC // bk  # rows one pass of 128-bit copies covers
    if rows == 0 or bm % rows or bn % rows:
        return (f"one pass of {threads} 128-bit copies covers {rows} rows of a {bk}-deep slab: "
                f"BLOCK_M={bm} and BLOCK_N={bn} must be multiples of it")
    if p.get("INTERLEAVE") and bk < 2 * MFMA_K:
        return f"INTERLEAVE splits the K slab in 32-deep halves: needs BLOCK_K >= 64, got {bk}"
    vgprs = vgpr_estimate(bm, bn, bk, w)
    if vgprs > VGPR_BUDGET:
        return (f"needs about {vgprs} VGPRs per lane ({bm}x{bn} accumulator over {w} waves), "
                f"over the {VGPR_BUDGET} FlyDSL can use (no AGPRs): it would spill")
    lds = lds_bytes(bm, bn, bk, s, element_bytes)
    if lds > LDS_BYTES:
        return (f"needs {lds} B of LDS (max of the {s}-stage ring of {bm}x{bk} + {bn}x{bk} slabs and "
                f"the {bm}x{bn} fp32 accumulator tile), gfx950 has {LDS_BYTES}")
    return None

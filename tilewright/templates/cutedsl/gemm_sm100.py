"""CuTeDSL dense GEMM for sm_100a: TMA, tcgen05 (UMMA) into tensor memory, warp-specialised,
persistent, with 1-CTA or 2-CTA (cta_group::2) MMAs and the fused epilogue.

The kernel is in ``gemm_sm100.py.jinja``; the design follows the Blackwell GEMM structure of
NVIDIA's CUTLASS (TMA warp, MMA warp, four epilogue warps, accumulators double-buffered in TMEM),
written against the ``nvidia-cutlass-dsl`` API.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Knob, ParamSpace, Params, Support, SUPPORTED
from tilewright.templates.cutedsl.common import (
    CUTE_DTYPE, FP8, PDL_KNOB, SMEM_BUDGET, TORCH_DTYPE, CuteDslGemm, smem_bytes, useful_stages,
)

AB_DTYPES = ("bf16", "fp16") + FP8
MMA_KIND = {"bf16": "f16", "fp16": "f16", "fp8e4m3": "f8f6f4", "fp8e5m2": "f8f6f4"}


def max_stages(tile_m: int, tile_n: int, tile_k: int, element_bytes: float) -> int:
    """Deepest pipeline (2..8) whose A/B ring fits in shared memory."""
    per_stage = smem_bytes(tile_m, tile_n, tile_k, 1, element_bytes)
    return max(2, min(8, SMEM_BUDGET // per_stage))


class CuteGemmSm100(CuteDslGemm):
    id = "cutedsl.gemm_sm100"
    arch = "sm_100a"
    jinja = "gemm_sm100.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (64, 128), 128, "output rows per CTA (one MMA covers CTA_GROUP * BLOCK_M)"),
        Knob("BLOCK_N", (64, 128, 256), 128, "output columns per CTA (the MMA's N)"),
        Knob("BLOCK_K", (64, 128), 64, "K per pipeline stage: 128 bytes (64 bf16, 128 fp8)"),
        Knob("CTA_GROUP", (1, 2), 1, "CTAs per MMA: 2 runs cta_group::2 MMAs on a cluster pair"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "tile rows per swizzle group of the tile scheduler"),
        Knob("num_warps", (6,), 6, "warps per CTA: 4 epilogue, 1 MMA, 1 TMA (fixed)"),
        Knob("num_stages", (2, 3, 4, 5, 6, 7, 8), 4, "depth of the shared-memory operand ring"),
        PDL_KNOB,
    ))

    def dtype_support(self, problem: GemmProblem) -> Support:
        if problem.dtype not in AB_DTYPES:
            return Support(False, f"input dtype {problem.dtype} (takes {', '.join(AB_DTYPES)})")
        if problem.K == 0 and "K" not in problem.dynamic:
            return Support(False, "K == 0 (nothing to multiply; ATen fills the epilogue)")
        return SUPPORTED

    def tile_refusal(self, params: Params, problem: GemmProblem) -> str | None:
        eb = ELEMENT_BYTES[problem.dtype]
        if params["BLOCK_K"] * eb != 128:
            return f"BLOCK_K must span 128 bytes of K ({int(128 // eb)} for {problem.dtype})"
        # per CTA: its BLOCK_M rows of A and, in a cta_group::2 pair, half of the B tile
        smem = smem_bytes(params["BLOCK_M"], params["BLOCK_N"] // params["CTA_GROUP"],
                          params["BLOCK_K"], params["num_stages"], eb)
        if smem > SMEM_BUDGET:
            return f"the operand ring needs {smem} B of shared memory (> {SMEM_BUDGET})"
        return None

    def seed_tiles(self, problem: GemmProblem) -> list[dict[str, Any]]:
        eb = ELEMENT_BYTES[problem.dtype]
        bk = int(128 // eb)
        # (BLOCK_M, BLOCK_N, CTA_GROUP): the 2-CTA 256x256 MMA for big problems, smaller tiles
        # when few tiles would leave SMs idle, BLOCK_M = 64 for decode-sized M
        shapes = [(128, 256, 2), (128, 256, 1), (128, 128, 2), (128, 128, 1), (128, 64, 1)]
        if problem.M <= 64:  # decode: 64-row MMAs only
            shapes = [(64, 128, 1), (64, 64, 1), (64, 256, 1)]
        out = []
        for bm, bn, group in shapes:
            stages = useful_stages(problem, bk, max_stages(bm, bn // group, bk, eb))
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "CTA_GROUP": group,
                        "GROUP_M": 8, "num_warps": 6, "num_stages": stages})
        return out

    def extra_context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        return dict(ab_cute=CUTE_DTYPE[problem.dtype], ab_torch=TORCH_DTYPE[problem.dtype],
                    ab_align=int(16 // ELEMENT_BYTES[problem.dtype]),
                    # two accumulators let the epilogue of one tile overlap the next mainloop;
                    # 2 x BLOCK_N fp32 columns always fit the 512 TMEM columns
                    acc_stages=2)

    def mma_checks(self, problem: GemmProblem, params: Params) -> list[InstructionCheck]:
        kind = MMA_KIND[problem.dtype]
        group = params["CTA_GROUP"]
        return [InstructionCheck("ptx", (rf"tcgen05\.mma\.cta_group::{group}\.kind::{kind}",),
                                 (r"wgmma",), f"{group}-CTA tcgen05 MMAs (kind::{kind})")]

    def efficiency(self, target: Target) -> float:
        # a warp-specialised TMA + tcgen05 pipeline with the epilogue overlapping the next
        # mainloop (double-buffered TMEM): credited above the Triton TMA kernel (1.15); an
        # estimate until measured on a B200
        return 1.25

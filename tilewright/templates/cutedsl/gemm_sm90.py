"""CuTeDSL dense GEMM for sm_90a: TMA (with cluster multicast), wgmma, a producer warp group and
one or two consumer warp groups (warp-specialised), persistent, with the fused epilogue.

The kernel is in ``gemm_sm90.py.jinja``; the structure is Hopper's warp-specialised GEMM as in
NVIDIA's CUTLASS (producer/consumer warp groups around an mbarrier ring, setmaxnreg), written
against the ``nvidia-cutlass-dsl`` API.
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
PTX_TYPE = {"bf16": "bf16", "fp16": "f16", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2"}
# fp32 accumulator registers a consumer thread may hold (of the 232 setmaxnreg gives it)
MAX_ACC_REGS = 128


class CuteGemmSm90(CuteDslGemm):
    id = "cutedsl.gemm_sm90"
    arch = "sm_90a"
    jinja = "gemm_sm90.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (64, 128, 256), 128, "output rows per CTA"),
        Knob("BLOCK_N", (64, 128, 256), 128, "output columns per CTA (the wgmma N)"),
        Knob("BLOCK_K", (64, 128), 64, "K per pipeline stage: 128 bytes (64 bf16, 128 fp8)"),
        Knob("CLUSTER_M", (1, 2), 1, "CTAs per cluster along M (they share, and multicast, B)"),
        Knob("CLUSTER_N", (1, 2), 1, "CTAs per cluster along N (they share, and multicast, A)"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "tile rows per swizzle group of the tile scheduler"),
        Knob("num_warps", (8, 12), 12, "4 producer warps + 1 or 2 consumer warp groups"),
        Knob("num_stages", (2, 3, 4, 5, 6, 7, 8), 4, "depth of the shared-memory operand ring"),
        PDL_KNOB,
    ))

    def dtype_support(self, problem: GemmProblem) -> Support:
        if problem.dtype not in AB_DTYPES:
            return Support(False, f"input dtype {problem.dtype} (takes {', '.join(AB_DTYPES)})")
        if problem.dtype in FP8 and (problem.layout_a, problem.layout_b) != ("row", "col"):
            return Support(False, "fp8 wgmma reads K-major operands only (A row-major, B column-major)")
        if problem.K == 0 and "K" not in problem.dynamic:
            return Support(False, "K == 0 (nothing to multiply; ATen fills the epilogue)")
        return SUPPORTED

    @staticmethod
    def consumers(params: Params) -> int:
        return params["num_warps"] // 4 - 1

    def tile_refusal(self, params: Params, problem: GemmProblem) -> str | None:
        eb = ELEMENT_BYTES[problem.dtype]
        if params["BLOCK_K"] * eb != 128:
            return f"BLOCK_K must span 128 bytes of K ({int(128 // eb)} for {problem.dtype})"
        consumers = self.consumers(params)
        if params["BLOCK_M"] < 64 * consumers:
            return f"{consumers} consumer warp groups need BLOCK_M >= {64 * consumers} (64 rows each)"
        acc_regs = params["BLOCK_M"] * params["BLOCK_N"] // (128 * consumers)
        if acc_regs > MAX_ACC_REGS:
            return f"the accumulator needs {acc_regs} registers per consumer thread (> {MAX_ACC_REGS})"
        smem = smem_bytes(params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_stages"], eb)
        if smem > SMEM_BUDGET:
            return f"the operand ring needs {smem} B of shared memory (> {SMEM_BUDGET})"
        return None

    def seed_tiles(self, problem: GemmProblem) -> list[dict[str, Any]]:
        eb = ELEMENT_BYTES[problem.dtype]
        bk = int(128 // eb)
        # (BLOCK_M, BLOCK_N, consumer groups, CLUSTER_M, CLUSTER_N): the cooperative 128x256
        # tile with a 2x1 cluster for big problems, down to one consumer group for decode
        shapes = [(128, 256, 2, 2, 1), (128, 256, 2, 1, 1), (256, 128, 2, 1, 1), (128, 128, 2, 1, 2),
                  (128, 128, 1, 1, 1), (128, 64, 1, 1, 1)]
        if problem.M <= 64:  # decode: the smallest wgmma row count, never a 128-row tile
            shapes = [(64, 128, 1, 1, 1), (64, 256, 1, 1, 1), (64, 64, 1, 1, 1)]
        out = []
        for bm, bn, consumers, cm, cn in shapes:
            per_stage = smem_bytes(bm, bn, bk, 1, eb)
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "CLUSTER_M": cm,
                        "CLUSTER_N": cn, "GROUP_M": 8, "num_warps": 4 * (1 + consumers),
                        "num_stages": useful_stages(problem, bk, max(2, min(8, SMEM_BUDGET // per_stage)))})
        return out

    def extra_context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        consumers = self.consumers(params)
        acc_elems = params["BLOCK_M"] * params["BLOCK_N"] // (128 * consumers)
        return dict(ab_cute=CUTE_DTYPE[problem.dtype], ab_torch=TORCH_DTYPE[problem.dtype],
                    ab_align=int(16 // ELEMENT_BYTES[problem.dtype]), consumers=consumers,
                    # 32 accumulator elements = 8 column pairs of 2 rows of a wgmma fragment
                    epi_chunk=min(32, acc_elems))

    def mma_checks(self, problem: GemmProblem, params: Params) -> list[InstructionCheck]:
        t = PTX_TYPE[problem.dtype]
        return [InstructionCheck("ptx", (rf"wgmma\.mma_async\S*\.f32\.{t}\.{t}",), (r"tcgen05",),
                                 f"warpgroup MMA (wgmma, {t})")]

    def efficiency(self, target: Target) -> float:
        # producer/consumer warp groups with setmaxnreg and multicast TMA: credited above the
        # Triton TMA kernel (1.15); an estimate until measured on the H200
        return 1.2

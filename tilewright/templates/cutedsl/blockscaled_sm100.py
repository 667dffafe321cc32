"""CuTeDSL block-scaled GEMM for sm_100a: NVFP4 (E2M1 values, E4M3 scale per 16), MXFP4 (E2M1,
E8M0 scale per 32) and MXFP8 (E4M3, E8M0 per 32) through tcgen05's block-scaled MMA
(``tcgen05.mma ... block_scale``), with the per-tensor global scales (alpha) and the rest of the
epilogue fused.

Operands come as stored: A (M, K) and B (N, K), K-major, values packed along K; the scales in
the 128x4 tiled layout tcgen05 reads (``tilewright.quant.nvfp4.swizzle_scales``; a problem with
``scale_layout == "row"`` gets them swizzled in the launcher). Formats: NVIDIA's NVFP4 and the
OCP Microscaling Formats (MX) v1.0 specification; the scale layout is the PTX ISA's
"tcgen05 block scaling" layout (also cuBLAS's 1D block-scaling layout).
"""

from __future__ import annotations

from typing import Any

from tilewright.problem import SCALED_FORMATS, GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Knob, ParamSpace, Params, Support, SUPPORTED
from tilewright.templates.cutedsl.common import PDL_KNOB, SMEM_BUDGET, CuteDslGemm, useful_stages

# format -> (value type, values per byte, scale type, torch scale dtype)
FORMATS = {
    "nvfp4": ("cutlass.Float4E2M1FN", 2, "cutlass.Float8E4M3FN", "float8_e4m3fn"),
    "mxfp4": ("cutlass.Float4E2M1FN", 2, "cutlass.Float8E8M0FNU", "float8_e8m0fnu"),
    "mxfp8": ("cutlass.Float8E4M3FN", 1, "cutlass.Float8E8M0FNU", "float8_e8m0fnu"),
}
# what each format's MMA is called in PTX (measured with nvidia-cutlass-dsl 4.8.1)
MMA_KIND = {"nvfp4": r"kind::mxf4nvf4\.block_scale\.block16",
            "mxfp4": r"kind::mxf4nvf4\.block_scale\.block32",
            "mxfp8": r"kind::mxf8f6f4\.block_scale\.block32"}
TMEM_COLUMNS = 512


def value_bytes(fmt: str) -> float:
    return 1 / FORMATS[fmt][1]


class CuteBlockScaledSm100(CuteDslGemm):
    id = "cutedsl.blockscaled_sm100"
    arch = "sm_100a"
    jinja = "blockscaled_sm100.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (128,), 128, "output rows per CTA (block-scaled MMAs are 128 rows per CTA)"),
        Knob("BLOCK_N", (128, 256), 128, "output columns per CTA (the MMA's N)"),
        Knob("BLOCK_K", (128, 256), 256, "K values per pipeline stage: 128 bytes (256 fp4, 128 fp8)"),
        Knob("CTA_GROUP", (1, 2), 1, "CTAs per MMA: 2 runs cta_group::2 MMAs on a cluster pair"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "tile rows per swizzle group of the tile scheduler"),
        Knob("num_warps", (6,), 6, "warps per CTA: 4 epilogue, 1 MMA, 1 TMA (fixed)"),
        Knob("num_stages", (2, 3, 4, 5, 6, 7, 8), 4, "depth of the shared-memory operand ring"),
        PDL_KNOB,
    ))

    def dtype_support(self, problem: GemmProblem) -> Support:
        if problem.dtype not in FORMATS:
            return Support(False, f"input dtype {problem.dtype} (takes block-scaled {', '.join(FORMATS)})")
        if (problem.layout_a, problem.layout_b) != ("row", "col"):
            return Support(False, "block-scaled operands must be K-major: A (M, K) and B stored (N, K)")
        if problem.K == 0 and "K" not in problem.dynamic:
            return Support(False, "K == 0 (nothing to multiply; ATen fills the epilogue)")
        return SUPPORTED

    def tile_refusal(self, params: Params, problem: GemmProblem) -> str | None:
        vb = value_bytes(problem.dtype)
        if params["BLOCK_K"] * vb != 128:
            return f"BLOCK_K must span 128 bytes of K ({int(128 / vb)} values for {problem.dtype})"
        sf_bytes = (params["BLOCK_M"] + max(params["BLOCK_N"], 128)) * params["BLOCK_K"] \
            // SCALED_FORMATS[problem.dtype]
        per_stage = (params["BLOCK_M"] + params["BLOCK_N"] // params["CTA_GROUP"]) * params["BLOCK_K"] * vb \
            + sf_bytes
        if per_stage * params["num_stages"] > SMEM_BUDGET:
            return f"the operand ring needs {int(per_stage * params['num_stages'])} B of shared memory (> {SMEM_BUDGET})"
        return None

    def acc_stages(self, params: Params) -> int:
        """Accumulators in TMEM: two (epilogue overlapping the next mainloop) when they fit next
        to one stage of scale factors (4 columns per 32 rows of A and of B), else one."""
        sf_columns = (params["BLOCK_M"] // 32) * 4 + (max(params["BLOCK_N"], 128) // 32) * 4
        return 2 if 2 * params["BLOCK_N"] + sf_columns <= TMEM_COLUMNS else 1

    def seed_tiles(self, problem: GemmProblem) -> list[dict[str, Any]]:
        bk = int(128 / value_bytes(problem.dtype))
        shapes = [(256, 2), (128, 2), (256, 1), (128, 1)]
        if problem.M <= 128:
            # decode: one CTA per MMA keeps the most tiles in flight across the SMs
            shapes = [(128, 1), (256, 1), (128, 2)]
        out = []
        for bn, group in shapes:
            params = {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": bk, "CTA_GROUP": group, "GROUP_M": 8,
                      "num_warps": 6, "num_stages": useful_stages(problem, bk, 8)}
            while params["num_stages"] > 2 and self.tile_refusal(params, problem):
                params["num_stages"] -= 1  # the deepest ring that fits
            out.append(params)
        return out

    def extra_context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        ab, pack, sf, sf_torch = FORMATS[problem.dtype]
        value_torch = "(torch.uint8, torch.float4_e2m1fn_x2)" if pack == 2 else "(torch.float8_e4m3fn,)"
        return dict(fmt=problem.dtype, ab_cute=ab, pack=pack, sf_cute=sf, sf_torch=sf_torch,
                    value_torch=value_torch,
                    sf_vec=SCALED_FORMATS[problem.dtype], scale_layout=problem.scale_layout,
                    acc_stages=self.acc_stages(params))

    def mma_checks(self, problem: GemmProblem, params: Params) -> list[InstructionCheck]:
        group = params["CTA_GROUP"]
        kind = MMA_KIND[problem.dtype]
        return [InstructionCheck("ptx", (rf"tcgen05\.mma\.cta_group::{group}\.{kind}",), (r"wgmma",),
                                 f"{group}-CTA block-scaled tcgen05 MMAs ({problem.dtype})"),
                InstructionCheck("ptx", (r"tcgen05\.cp",), (), "scale factors copied to tensor memory")]

    def efficiency(self, target: Target) -> float:
        return 1.25  # as cutedsl.gemm_sm100: an estimate until measured on a B200

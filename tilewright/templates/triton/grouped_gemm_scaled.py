"""Block-scaled grouped GEMM in Triton (``F.scaled_grouped_mm``'s MoE forward in MXFP8, MXFP4,
NVFP4; :class:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem` with a recipe as its
dtype): the persistent grouped GEMM of ``triton.grouped_gemm`` (offsets read on the device) on
packed operands with row-major block scales, the gated product, NVFP4's per-group alpha and the
IR epilogue fused.

Two templates, one jinja source (``grouped_gemm_scaled.py.jinja``):

* ``triton.grouped_gemm_scaled`` dequantises in the prologue (values times block scales in
  registers, then a bf16 MMA; fp32 under the interpreter), as ``triton.gemm_nvfp4`` does for the
  dense GEMM: every Triton target, and the CPU interpreted;
* ``triton.grouped_gemm_scaled_mma`` hands the packed tiles and scales to ``tl.dot_scaled``, the
  block-scaled MMA: sm_100a (``tcgen05.mma ... block_scale``) and gfx950 (``v_mfma_scale``) for
  MX; NVFP4's E4M3 scales only on sm_100a with triton >= 3.9 (as ``triton.gemm_nvfp4_mma``).
  The interpreter runs it for MX (``tl.dot_scaled`` is exact there with E8M0 scales) but misreads
  E4M3 scales as E8M0, so NVFP4's numbers come from the dequantising template.

Parameters: BLOCK_M/BLOCK_N/BLOCK_K (whole scale blocks), num_warps, num_stages, tuned by the
grouped policy like ``triton.grouped_gemm``'s.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target, triton_can_target, triton_version
from tilewright.templates.base import SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, Support, powers_of_two
from tilewright.templates.triton.gemm import TRITON_POINTER, mma_checks
from tilewright.templates.triton.grouped_gemm import TritonGroupedGemm

DOT_SCALED_FORMAT = {"mxfp8": "e4m3", "mxfp4": "e2m1", "nvfp4": "e2m1"}


class TritonGroupedGemmScaled(TritonGroupedGemm):
    id = "triton.grouped_gemm_scaled"
    jinja = "grouped_gemm_scaled.py.jinja"
    kernel_name = "tw_grouped_gemm_scaled_kernel"
    scaled_mma = False
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of a group's output per work item"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns per work item"),
        Knob("BLOCK_K", (32, 64, 128, 256), 64, "K slice per step (whole 16- or 32-value scale blocks)"),
        Knob("num_warps", (1, 2, 4, 8), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4), 3, "software-pipeline depth"),
    ))

    def problem_support(self, problem: GroupedGemmProblem, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem) or not problem.block_scaled:
            return Support(False, f"{self.id} runs block-scaled grouped GEMMs (F.scaled_grouped_mm: "
                                  f"mxfp8, mxfp4, nvfp4); bf16/fp16/fp32 go to triton.grouped_gemm")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if target.backend == "cuda" and not target.has("fp8_e4m3"):
            # measured (triton 3.9, sm_80): "type fp8e4nv not supported in this architecture"
            return Support(False, f"{target.name} has no e4m3 conversions for the values or block scales "
                                  "(triton needs sm_89 or later)")
        return SUPPORTED

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """``triton.grouped_gemm``'s tiles clamped to a group's share, BLOCK_K at least 32 (whole
        scale blocks) and 64 on a GPU (a bf16 MMA's K step after the prologue)."""
        floor = 32 if target.interpreted else 64
        return [dict(p, BLOCK_K=max(p["BLOCK_K"], floor)) for p in super().seed_params(problem, target)]

    def context(self, problem: GroupedGemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(problem, params, target)
        ctx.update(fmt=problem.dtype, pack=problem.pack, sf_vec=problem.block, global_scales=problem.global_scales,
                   scaled_mma=self.scaled_mma, elem=DOT_SCALED_FORMAT[problem.dtype],
                   fp32_mma=target.interpreted, scale_zero="0.0" if problem.dtype == "nvfp4" else "0",
                   patterns=[inp.broadcast for inp in problem.epilogue_inputs])
        return ctx

    def aot_spec(self, problem: GroupedGemmProblem, params: Params) -> AotSpec:
        """Packed values and E8M0 scales as ``*u8``, NVFP4's E4M3 scales as ``*fp8e4nv``, every
        pointer 16-byte aligned; sizes and strides i32 (a group's base is widened in-kernel)."""
        scale = "*fp8e4nv" if problem.dtype == "nvfp4" else "*u8"
        pointers = {"A": "*u8", "B": "*u8", "AS": scale, "BS": scale, "GA": "*fp32", "GB": "*fp32",
                    "C": TRITON_POINTER[problem.out_dtype], "OFFS": "*i32"}
        if not problem.global_scales:
            pointers["GA"] = pointers["GB"] = "*i32"  # the launcher passes offs, never read
        for i, inp in enumerate(problem.epilogue_inputs):
            pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
        constexprs = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
        constexprs["stride_cn"] = 1
        # the sizes and strides the JIT would specialise as multiples of 16: without them the K
        # masks and row starts are not known constant/aligned over a vector, every byte is
        # loaded and every output stored on its own, and a 128-row tile spills (measured,
        # sm_100a, MXFP8 128x64x128: 255 registers and 1160 B of spill stores without)
        divisible = list(pointers)
        static = {d: d not in problem.dynamic for d in "MNK"}
        if static["K"]:
            row, scales = problem.K // problem.pack, problem.K // problem.block
            sizes = {"K": problem.K, "stride_am": row, "stride_bn": row, "stride_asm": scales, "stride_bsn": scales,
                     "stride_bg": problem.N * row, "stride_bsg": problem.N * scales}
            divisible += [name for name, v in sizes.items() if v % 16 == 0]
        if static["N"] and problem.out_n % 16 == 0:
            divisible += ["N", "stride_cm"] + (["half"] if problem.glu else [])
        return AotSpec(self.kernel_name, "triton", pointers, constexprs, tuple(divisible),
                       {"num_warps": params["num_warps"], "num_stages": params["num_stages"]})

    def expected_instructions(self, problem: GroupedGemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        """The bf16 MMA a dense GEMM of this tile uses (the prologue made the tiles bf16)."""
        from dataclasses import replace

        return mma_checks(replace(problem.as_gemm(), dtype="bf16", scale_layout=""), params, target)


# measured (triton 3.9, this template, MXFP8/MXFP4/NVFP4 with and without a gated product): on
# sm_100a only 128-row tiles lower to tcgen05 block_scale (64-row ones to an emulation without
# it), 32..256 columns, K steps of 64..256; on gfx950 32..128-row tiles and K steps of 64 and
# 128 all lower to v_mfma_scale_f32_*_f8f6f4
MMA_TILES = {
    "cuda": dict(BLOCK_M=(128,), BLOCK_N=(32, 64, 128, 256), BLOCK_K=(64, 128, 256), num_warps=(4, 8)),
    "hip": dict(BLOCK_M=(32, 64, 128, 256), BLOCK_N=(32, 64, 128, 256), BLOCK_K=(64, 128, 256), num_warps=(4, 8)),
}


# measured (triton 3.9, sm_100a, after the divisibility hints of aot_spec): 128x64 tiles in 4
# warps and 128x128 in 8 (64 accumulator registers per thread) build without spills at ~195
# registers; 128x128 in 4 warps (128 per thread) spills 324-340 B
TMEM_ACC_REGS = 64


class TritonGroupedGemmScaledMma(TritonGroupedGemmScaled):
    """The same grouped GEMM on block-scaled tensor cores (module docstring)."""

    id = "triton.grouped_gemm_scaled_mma"
    kernel_name = "tw_grouped_gemm_scaled_mma_kernel"
    scaled_mma = True

    def problem_support(self, problem: GroupedGemmProblem, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        if target.interpreted:
            if problem.dtype == "nvfp4":
                return Support(False, "the Triton interpreter reads E4M3 block scales as E8M0; "
                                      "use triton.grouped_gemm_scaled for NVFP4")
            if triton_version() < (3, 9):
                # measured: triton 3.6's interpreter fails in tl.dot_scaled ("'str' object has
                # no attribute 'value'"); 3.9's is exact for E8M0 scales
                return Support(False, "the Triton interpreter runs tl.dot_scaled from triton 3.9")
            return SUPPORTED
        if target.backend == "hip":
            if target.arch != "gfx950":
                return Support(False, f"{target.name} has no block-scaled MFMA (gfx950's v_mfma_scale)")
            if problem.dtype == "nvfp4":
                return Support(False, "gfx950's scaled MFMA takes E8M0 scales (MX), not NVFP4's E4M3")
            return SUPPORTED
        if not target.has("tcgen05"):
            return Support(False, f"{target.name} has no block-scaled tcgen05 MMA (sm_100a)")
        if problem.dtype == "nvfp4" and (triton_version() < (3, 9) or not target.has("nvfp4")):
            return Support(False, "NVFP4's E4M3-scaled dot_scaled lowers to block-scaled tcgen05 from triton 3.9")
        if problem.glu and triton_version() < (3, 9):
            # measured (triton 3.6, sm_100a, any num_stages): two dot_scaled accumulators abort
            # the compiler (NVWS InsertTmemAref: "allocOp->hasOneUse()"); 3.9 builds them
            return Support(False, "a gated product's two block-scaled accumulators need triton >= 3.9 on sm_100a")
        return SUPPORTED

    def check(self, params: Params, problem: GroupedGemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := super().check(params, problem, target)) is not None:
            return why
        for knob, values in MMA_TILES.get(target.backend, {}).items():
            if params[knob] not in values:
                return f"{knob}={params[knob]}: the block-scaled MMA on {target.name} needs {knob} in {values}"
        regs = params["BLOCK_M"] * params["BLOCK_N"] * (2 if problem.glu else 1) / (params["num_warps"] * 32)
        if target.backend == "cuda" and regs > TMEM_ACC_REGS:
            return (f"the accumulator comes out of tensor memory as {regs:.0f} registers per thread "
                    f"(> {TMEM_ACC_REGS}: the epilogue spills)")
        return None

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        if target.interpreted:
            return [dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=1)]
        if target.backend == "cuda":
            # the last two for a gated product's two accumulators (check: TMEM_ACC_REGS)
            return [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3),
                    dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
                    dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=3),
                    dict(BLOCK_M=128, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=3)]
        return [dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=2),
                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=2),
                dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=2)]

    def expected_instructions(self, problem: GroupedGemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        if target.backend == "cuda":
            kind = r"kind::mxf4nvf4\.block_scale\.block16" if problem.dtype == "nvfp4" else \
                r"kind::mxf(8f6f4|4)\S*\.block_scale"
            return [InstructionCheck("ptx", (rf"tcgen05\.mma\S*{kind}",), (r"wgmma",),
                                     f"{problem.dtype} block-scaled tcgen05 MMA")]
        if target.backend == "hip":
            return [InstructionCheck("amdgcn", (r"v_mfma_scale_f32_\w+_f8f6f4",), (),
                                     f"{problem.dtype} block-scaled MFMA (gfx950)")]
        return []

    def efficiency(self, target: Target) -> float:
        return 1.1

"""Block-scaled GEMM in Triton (NVFP4, and MXFP4 / MXFP8), dequantising in the prologue (serves
every target, and Hopper, which has no FP4 MMA). Runs in the interpreter, so the formats'
numerics are tested on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import SCALED_FORMATS, VALUES_PER_BYTE
from tilewright.runtime.targets import Target, triton_can_target, triton_version
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, ParamSpace, Params, Support, powers_of_two,
)
from tilewright.templates.triton.gemm import (
    TRITON_POINTER, TritonGemm, compile_options, divisible_sizes, epilogue_unit_strides, mma_checks,
)
from tilewright.templates.triton.pdl import PDL_KNOB, pdl_checks

# decode remedies (kinds/gemm/decode.py proposes them): the kernel is symmetric in its operands,
# so swap-AB is free; split-K adds an fp32 workspace and a reduce kernel with the epilogue
DECODE_KNOBS = (
    Knob("SPLIT_K", (1, 2, 4, 8, 16), 1, "programs sharing one tile's K range"),
    Knob("SWAP_AB", (False, True), False, "compute C^T = B A^T: the weight's N fills the MMA's rows"),
    PDL_KNOB,
)


class TritonGemmNvfp4(TritonGemm):
    stores_acc = False
    id = "triton.gemm_nvfp4"
    jinja = "gemm_nvfp4.py.jinja"
    kernel_name = "tw_gemm_nvfp4_kernel"
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 128), 64, "rows of C per program"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns of C per program"),
        Knob("BLOCK_K", (32, 64, 128, 256), 64, "K slice per step (whole 16-value scale blocks)"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
        Knob("num_warps", (1, 2, 4, 8), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4), 2, "software-pipeline depth"),
    ) + DECODE_KNOBS)

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype not in SCALED_FORMATS:
            return Support(False, "this template dequantises NVFP4, MXFP4 and MXFP8 operands")
        if target.backend == "cuda" and not target.has("fp8_e4m3"):
            # measured (triton 3.9, sm_80): "type fp8e4nv not supported in this architecture"
            return Support(False, f"{target.name} has no e4m3 conversions for the block scales "
                                  "(triton needs sm_89 or later)")
        if problem.scale_layout != "row":
            return Support(False, "needs row-major block scales (scale_layout='row')")
        if problem.batched or problem.layout_a != "row" or problem.layout_b != "col":
            return Support(False, "needs A (M, K) and B stored (N, K), both packed along K")
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        return SUPPORTED

    def _as_bf16(self, problem: GemmProblem) -> GemmProblem:
        """The dense problem the prologue turns this into (bf16 tiles), for shared checks."""
        return dataclasses.replace(problem, dtype="bf16", scale_layout="")

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        return super().check(params, self._as_bf16(problem), target)

    scaled_mma = False

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(self._as_bf16(problem), params, target)
        ctx.update(problem_text=problem.describe(), fp32_mma=target.interpreted,
                   scaled_mma=self.scaled_mma, fmt=problem.dtype, pack=VALUES_PER_BYTE[problem.dtype],
                   sf_vec=SCALED_FORMATS[problem.dtype])
        return ctx

    def aot_spec(self, problem: GemmProblem, params: Params) -> AotSpec:
        """The main kernel's spec (under split-K the reduce kernel is compiled by the JIT only:
        it is the same few lines for every GEMM)."""
        split = params.get("SPLIT_K", 1) > 1
        swap = bool(params.get("SWAP_AB"))
        kp = problem.transposed() if swap else problem  # what the kernel computes
        scale = "*fp8e4nv" if problem.dtype == "nvfp4" else "*u8"  # E8M0 scales go as their bytes
        pointers = {"A": "*u8", "B": "*u8", "AS": scale, "BS": scale,
                    "C": "*fp32" if split else TRITON_POINTER[problem.out_dtype]}
        constexprs: dict[str, Any] = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        if split:  # the fp32 workspace (SPLIT_K, M, N): unit column stride
            constexprs["stride_cn"] = 1
        else:
            for i, inp in enumerate(kp.epilogue_inputs):
                pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
            constexprs.update({"stride_cm" if swap else "stride_cn": 1}, **epilogue_unit_strides(kp))
        dyn = problem.dynamic
        divisible = divisible_sizes(kp)
        if "K" not in dyn and (problem.K // VALUES_PER_BYTE[problem.dtype]) % 16 == 0:
            divisible += ["stride_am", "stride_bn"]
        if split and "N" not in kp.dynamic and kp.N % 16 == 0:
            divisible.append("stride_cm")
        elif not split and "N" not in dyn and problem.N % 16 == 0:
            divisible.append("stride_cn" if swap else "stride_cm")
        return AotSpec(self.kernel_name, "triton", pointers, constexprs,
                       tuple(pointers) + tuple(divisible), compile_options(params))

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        kp = self._as_bf16(problem.transposed() if params.get("SWAP_AB") else problem)
        return mma_checks(kp, params, target) + pdl_checks(params, target)


class TritonGemmNvfp4Mma(TritonGemmNvfp4):
    """The same GEMM on block-scaled tensor cores (``tl.dot_scaled``): targets whose MMA reads
    E4M3 scales per 16 values (sm_100a: ``tcgen05.mma ... kind::mxf4nvf4.block_scale.block16``).
    Compiled ahead of time only: the Triton interpreter reads E4M3 block scales as E8M0 without
    complaint (DESIGN.md), so its numbers there would be wrong; the dequantising template is the
    tested reference."""

    id = "triton.gemm_nvfp4_mma"
    kernel_name = "tw_gemm_nvfp4_mma_kernel"
    scaled_mma = True
    space = ParamSpace((
        # measured (triton 3.9, sm_100a): only 128-row tiles lower to the block-scaled MMA;
        # 64-row tiles compile to an emulation, which the instruction check would reject. 16-
        # and 32-column tiles do lower (kind::mxf4nvf4.block_scale.block16): with swap-AB they
        # hold a decode step's few tokens while the weight's N fills the 128 rows
        Knob("BLOCK_M", (128,), 128, "rows of C per program"),
        Knob("BLOCK_N", (16, 32, 64, 128, 256), 128, "columns of C per program"),
        Knob("BLOCK_K", (64, 128, 256), 128, "K slice per step"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
        Knob("num_warps", (4, 8), 4, "warps per program"),
        Knob("num_stages", (2, 3, 4), 3, "software-pipeline depth"),
    ) + DECODE_KNOBS)

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if problem.dtype != "nvfp4":
            return Support(False, "this template is NVFP4's block-scaled MMA (MX goes through "
                                  "triton.gemm_nvfp4, cutedsl.blockscaled_sm100 or flydsl.mx_gemm)")
        if target.interpreted:
            return Support(False, "the Triton interpreter misreads E4M3 block scales; use triton.gemm_nvfp4")
        if triton_version() < (3, 9):
            # measured: triton 3.6 lowers an E4M3-scaled dot_scaled without block-scaled MMA
            return Support(False, "needs triton >= 3.9 to lower NVFP4 dot_scaled to block-scaled tcgen05")
        if not target.has("nvfp4") or not target.has("tcgen05"):
            return Support(False, f"{target.name} has no NVFP4 block-scaled tcgen05 MMA")
        return super().problem_support(problem, target)

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        return [InstructionCheck("ptx", (r"tcgen05\.mma\S*kind::mxf4nvf4\.block_scale\.block16",),
                                 (r"wgmma",), "NVFP4 block-scaled tcgen05 MMA")] + pdl_checks(params, target)

    def efficiency(self, target: Target) -> float:
        return 1.1

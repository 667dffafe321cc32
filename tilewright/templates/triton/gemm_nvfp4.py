"""NVFP4 x NVFP4 GEMM in Triton, dequantising in the prologue (serves every target, and Hopper,
which has no FP4 MMA). Runs in the interpreter, so NVFP4 numerics are tested on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target, triton_can_target, triton_version
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, ParamSpace, Params, Support, powers_of_two,
)
from tilewright.templates.triton.gemm import (
    TRITON_POINTER, TritonGemm, divisible_sizes, epilogue_unit_strides, mma_checks,
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
    ))

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype != "nvfp4":
            return Support(False, "this template dequantises NVFP4 operands")
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
                   scaled_mma=self.scaled_mma)
        return ctx

    def aot_spec(self, problem: GemmProblem, params: Params) -> AotSpec:
        pointers = {"A": "*u8", "B": "*u8", "AS": "*fp8e4nv", "BS": "*fp8e4nv",
                    "C": TRITON_POINTER[problem.out_dtype]}
        for i, inp in enumerate(problem.epilogue_inputs):
            pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
        constexprs: dict[str, Any] = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        constexprs.update(stride_cn=1, **epilogue_unit_strides(problem))
        dyn = problem.dynamic
        divisible = divisible_sizes(problem)
        if "K" not in dyn and problem.K % 32 == 0:
            divisible += ["stride_am", "stride_bn"]
        if "N" not in dyn and problem.N % 16 == 0:
            divisible.append("stride_cm")
        return AotSpec(self.kernel_name, "triton", pointers, constexprs,
                       tuple(pointers) + tuple(divisible),
                       {"num_warps": params["num_warps"], "num_stages": params["num_stages"]})

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        return mma_checks(self._as_bf16(problem), params, target)


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
        # 64-row tiles compile to an emulation, which the instruction check would reject
        Knob("BLOCK_M", (128,), 128, "rows of C per program"),
        Knob("BLOCK_N", (64, 128, 256), 128, "columns of C per program"),
        Knob("BLOCK_K", (64, 128, 256), 128, "K slice per step"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
        Knob("num_warps", (4, 8), 4, "warps per program"),
        Knob("num_stages", (2, 3, 4), 3, "software-pipeline depth"),
    ))

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
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
                                 (r"wgmma",), "NVFP4 block-scaled tcgen05 MMA")]

    def efficiency(self, target: Target) -> float:
        return 1.1

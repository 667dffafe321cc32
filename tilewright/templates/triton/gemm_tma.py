"""Persistent Triton GEMM that moves tiles through tensor descriptors.

``tl.make_tensor_descriptor`` lowers to the chip's copy engine: TMA (``cp.async.bulk.tensor``)
on sm_90a/sm_100a, the Tensor Data Mover (``tensor_load_to_lds``) on gfx1250; on gfx950 it is
the portable path (ordinary loads feeding MFMA). One program per SM walks the output tiles
(persistent), GROUP_M-swizzled. Descriptors need a unit-stride inner dim and 16-byte aligned
outer strides; the launcher copies an operand that is not (correct, slower), and ``supports``
refuses layouts no descriptor can describe. The Triton interpreter runs descriptors too, so the
template's numbers are tested on the CPU.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, ParamSpace, Params, Support
from tilewright.templates.triton.gemm import (
    CORE_KNOBS, TritonGemm, divisible_sizes, epilogue_unit_strides, mma_checks,
)
from tilewright.templates.triton.pdl import PDL_KNOB, pdl_checks


class TritonGemmTma(TritonGemm):
    stores_acc = False
    id = "triton.gemm_tma"
    jinja = "gemm_tma.py.jinja"
    kernel_name = "tw_gemm_tma_kernel"
    space = ParamSpace(CORE_KNOBS + (PDL_KNOB,))

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        if target.backend == "cuda" and not target.has("tma"):
            return Support(False, f"{target.name} has no TMA")
        if target.backend == "hip" and target.arch not in ("gfx1250", "gfx950"):
            return Support(False, f"tensor descriptors are not generated for {target.arch}")
        if problem.batched:
            return Support(False, "batched GEMMs use triton.gemm (descriptors here are 2-D)")
        if "strided" in (problem.layout_a, problem.layout_b):
            return Support(False, "a descriptor needs one contiguous dim in each operand")
        if any(p.broadcast.startswith("B") for p in problem.epilogue_inputs):
            return Support(False, "batched epilogue inputs")
        eb = ELEMENT_BYTES[problem.dtype]
        inner_a = problem.K if problem.layout_a == "row" else problem.M
        inner_b = problem.N if problem.layout_b == "row" else problem.K
        for name, size in (("A", inner_a), ("B", inner_b)):
            dim = {"A": "K" if problem.layout_a == "row" else "M",
                   "B": "N" if problem.layout_b == "row" else "K"}[name]
            if dim not in problem.dynamic and (size * eb) % 16:
                return Support(False, f"{name}'s rows are {size * eb} bytes, not a multiple of 16")
        return base

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        why = super().check(params, problem, target)
        if why:
            return why
        if params["BLOCK_K"] * ELEMENT_BYTES[problem.dtype] < 32:
            return "descriptor tiles need an inner dim of at least 32 bytes"
        return None

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(problem, params, target)
        ctx.update(a_col_major=problem.layout_a == "col", b_col_major=problem.layout_b == "col")
        return ctx

    def unit_strides(self, problem: GemmProblem, params: Params | None = None) -> dict[str, int]:
        return {"stride_cn": 1} | epilogue_unit_strides(problem)

    def divisible(self, problem: GemmProblem) -> list[str]:
        dyn = problem.dynamic
        names = divisible_sizes(problem)
        outer_a = ("K", problem.K) if problem.layout_a == "row" else ("M", problem.M)
        outer_b = ("N", problem.N) if problem.layout_b == "row" else ("K", problem.K)
        for arg, (dim, v) in (("stride_a", outer_a), ("stride_b", outer_b), ("stride_cm", ("N", problem.N))):
            if dim not in dyn and v % 16 == 0:
                names.append(arg)
        return names

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        checks = mma_checks(problem, params, target) + pdl_checks(params, target)
        if target.backend == "cuda":
            checks.append(InstructionCheck("ptx", (r"cp\.async\.bulk\.tensor",), (), "TMA tile loads"))
        elif target.arch == "gfx1250":
            checks.append(InstructionCheck("amdgcn", (r"tensor_load_to_lds",), (), "TDM tile loads"))
        return checks

    def efficiency(self, target: Target) -> float:
        # TMA/TDM free the warps from address math and keep the pipeline full: the usual
        # measured gain of a persistent TMA GEMM over the plain one on Hopper is 10-20%
        return 1.15 if target.has("tma") or target.has("tdm") else 1.0

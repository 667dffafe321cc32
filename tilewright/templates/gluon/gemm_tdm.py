"""Gluon GEMM for gfx1250 with explicit Tensor Data Mover pipelining.

Where ``triton.gemm_tma`` lets the compiler place the TDM copies, this template says exactly
what happens: ``gluon.language.amd.gfx1250.tdm.async_load`` copies A and B tiles into padded LDS
buffers NUM_BUFFERS - 1 steps ahead, ``async_wait`` bounds the copies in flight, and
``amd.gfx1250.wmma`` consumes each tile from LDS. gfx1250 only (compiled ahead of time here:
there is no interpreter for Gluon); fp16/bf16 inputs, A row-major.
"""

from __future__ import annotations

import math
from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, ParamSpace, Params, Support,
)
from tilewright.templates.triton.gemm import TRITON_POINTER, TritonGemm, divisible_sizes


def warp_bases(num_warps: int) -> tuple[tuple[int, int], ...]:
    """Warp placement in WMMA tiles: the first warp bit steps along N, the rest along M."""
    return ((0, 1),) + tuple((1 << i, 0) for i in range(int(math.log2(num_warps // 2))))


class GluonGemmTdm(TritonGemm):
    id = "gluon.gemm_tdm"
    backend = "gluon"
    jinja = "gemm_tdm.py.jinja"
    kernel_name = "tw_gemm_tdm_kernel"
    space = ParamSpace((
        Knob("BLOCK_M", (32, 64, 128, 256), 128, "rows of C per program"),
        Knob("BLOCK_N", (32, 64, 128, 256), 128, "columns of C per program"),
        Knob("BLOCK_K", (32, 64, 128), 64, "K slice per TDM copy"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
        Knob("num_warps", (4, 8), 4, "warps per program"),
        Knob("num_stages", (2, 3, 4), 3, "LDS buffers (copies in flight + 1)"),
    ))

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if problem.store_acc:
            return Support(False, f"{self.id} does not store the product beside its epilogue")
        if problem.epilogue_ir:
            return Support(False, f"{self.id} runs the epilogue kinds only, not an IR epilogue")
        if target.name != "hip:gfx1250":
            return Support(False, f"the Gluon TDM GEMM is written for gfx1250, not {target.name}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype not in ("fp16", "bf16"):
            return Support(False, f"input dtype {problem.dtype} (this WMMA path takes fp16/bf16)")
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        if problem.batched or any(p.broadcast.startswith("B") for p in problem.epilogue_inputs):
            return Support(False, "batched GEMMs use triton.gemm")
        if problem.layout_a != "row" or problem.layout_b == "strided":
            return Support(False, "needs A row-major and B with a contiguous dim")
        eb = ELEMENT_BYTES[problem.dtype]
        inner_b = problem.K if problem.layout_b == "col" else problem.N
        if ("K" not in problem.dynamic and (problem.K * eb) % 16) or (inner_b * eb) % 16:
            return Support(False, "TDM rows must be multiples of 16 bytes")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        warps_m = params["num_warps"] // 2
        if params["BLOCK_M"] < 16 * warps_m or params["BLOCK_N"] < 32:
            return f"BLOCK_M must cover {warps_m} warps of 16 rows and BLOCK_N two of 16 columns"
        lds = params["num_stages"] * (params["BLOCK_M"] + params["BLOCK_N"]) * params["BLOCK_K"] \
            * ELEMENT_BYTES[problem.dtype]
        if lds > target.smem_per_block:
            return f"needs {lds} B of LDS, {target.name} has {target.smem_per_block}"
        if params["BLOCK_M"] * params["BLOCK_N"] / (params["num_warps"] * target.warp_size) > 128:
            return "accumulator too large for the registers"
        return None

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ctx = super().context(problem, params, target)
        # Gluon's language is not Triton's: it keeps the jinja epilogue (common/epilogue.jinja)
        ops = [{"kind": op.kind, "input": op.input, "scale": op.scale, "reverse": op.reverse,
                "scalar_text": repr(float(op.scalar)) if op.scalar is not None else ""}
               for op in problem.epilogue]
        ctx.update(epilogue=ops, inputs=problem.epilogue_inputs,
                   uses_tanh=any(op.kind in ("tanh", "gelu_tanh") for op in problem.epilogue))
        ctx.update(b_col_major=problem.layout_b == "col",
                   warp_bases=warp_bases(params["num_warps"]))
        return ctx

    def aot_spec(self, problem: GemmProblem, params: Params) -> AotSpec:
        pointers = {"A": TRITON_POINTER[problem.dtype], "B": TRITON_POINTER[problem.dtype],
                    "C": TRITON_POINTER[problem.out_dtype]}
        for i, inp in enumerate(problem.epilogue_inputs):
            pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
        constexprs: dict[str, Any] = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        constexprs.update(NUM_BUFFERS=params["num_stages"], TRANSPOSE_B=problem.layout_b == "col",
                          WARP_BASES=warp_bases(params["num_warps"]), stride_cn=1)
        constexprs["stride_bk" if problem.layout_b == "col" else "stride_bn"] = 1
        divisible = list(pointers) + divisible_sizes(problem)
        return AotSpec(self.kernel_name, "gluon", pointers, constexprs, tuple(divisible),
                       {"num_warps": params["num_warps"]})

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        return [InstructionCheck("amdgcn", (r"tensor_load_to_lds", r"s_wait_tensorcnt", r"v_wmma"),
                                 (), "TDM copies into LDS feeding WMMA")]

    def efficiency(self, target: Target) -> float:
        return 1.2  # explicit multi-buffered TDM pipeline

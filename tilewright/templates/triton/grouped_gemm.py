"""Persistent Triton grouped GEMM: all four ``_grouped_mm`` shape cases, offsets read on the
device, and the GEMM templates' epilogue hook.

A fixed grid of ``NUM_PROGRAMS`` programs (the target's SM count; 4 under the interpreter)
walks the (group, tile) work items: each program loops over the groups, loads the group's
[start, end) from the int32 end offsets *inside the kernel* (no host sync, so it runs in a CUDA
graph and never waits on the GPU), counts the group's tiles and takes every NUM_PROGRAMS-th
work item. Ragged groups are masked; empty groups have no tiles (2d3d, 3d2d) or an empty K
loop (2d2d: the tile is ``epilogue(0)``). Accumulation is fp32; the epilogue sees
``pid_b`` = the group, so a per-group bias is an epilogue input with a "B" in its pattern.

A fused gated product (``problem.glu``, the MoE gate_up projection's ``act(gate) * up``) tiles
the N/2 *output* columns: a program holds gate column j and up column j + N/2 in two fp32
accumulators fed by the same A tile (two dots per K step), multiplies them after the K loop and
hands the product to the epilogue, so the (T, N) projection never reaches memory.

Parameters: BLOCK_M/BLOCK_N/BLOCK_K, num_warps, num_stages. Under the interpreter bf16 tiles
are upcast to fp32 before ``tl.dot`` (triton issue 11584, as in triton.gemm).
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.problem import EpilogueOp
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.templates.base import (
    SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
    powers_of_two,
)
from tilewright.templates.triton.epilogue import render_epilogue
from tilewright.problem import ELEMENT_BYTES
from tilewright.templates.triton.gemm import MAX_ACC_REGS_PER_THREAD, TORCH_DTYPE, TRITON_POINTER, mma_checks

INTERPRETER_PROGRAMS = 4  # enough to exercise the persistent stride, few enough to stay quick


class TritonGroupedGemm(TemplateSpec):
    id = "triton.grouped_gemm"
    backend = "triton"
    op = "grouped_gemm"
    jinja = "grouped_gemm.py.jinja"
    kernel_name = "tw_grouped_gemm_kernel"
    fuses_glu = True  # renders problem.glu (the policy offers glu problems only to such templates)
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of a group's output per work item"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns per work item"),
        Knob("BLOCK_K", powers_of_two(16, 256), 32, "K slice per main-loop step"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4, 5, 6), 3, "software-pipeline depth"),
    ))

    def problem_support(self, problem: GroupedGemmProblem, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, f"{self.id} runs grouped GEMMs (tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem)")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"input dtype {problem.dtype} (the grouped template takes fp32/fp16/bf16)")
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        return SUPPORTED

    # tiles the software pipeline holds in shared memory: measured (triton 3.9, sm_90a, bf16
    # 128x128x64, 3 stages) num_stages - 1 copies for pointer loads, num_stages for descriptors
    buffered_stages_offset = 1

    def smem_bytes(self, problem: GroupedGemmProblem, params: Params) -> int:
        """Shared memory of the pipelined A and B tiles (two B tiles under a GLU)."""
        tile = params["BLOCK_M"] * params["BLOCK_K"] + params["BLOCK_K"] * params["BLOCK_N"] * (2 if problem.glu else 1)
        stages = max(params["num_stages"] - self.buffered_stages_offset, 1)
        return stages * tile * ELEMENT_BYTES[problem.dtype]

    def check(self, params: Params, problem: GroupedGemmProblem, target: Target) -> str | None:
        """Why ``params`` cannot run ``problem`` on ``target``: outside the space, more shared
        memory than a block gets, or more accumulator registers than a thread holds (a GLU
        keeps two accumulators). The interpreter has neither limit."""
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if target.interpreted:
            return None
        smem = self.smem_bytes(problem, params)
        if target.smem_per_block and smem > target.smem_per_block:
            return f"needs {smem} B shared memory, {target.name} has {target.smem_per_block}"
        acc = params["BLOCK_M"] * params["BLOCK_N"] * (2 if problem.glu else 1)
        regs = acc / (params["num_warps"] * target.warp_size)
        if regs > MAX_ACC_REGS_PER_THREAD:
            return f"accumulators need {regs:.0f} registers per thread (> {MAX_ACC_REGS_PER_THREAD})"
        return None

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """Tiles clamped to the per-group sizes (a group's share of the ragged dim)."""
        def clamp(v: int, n: int) -> int:
            p = 16
            while p < n:
                p *= 2
            return min(v, p)
        share = {d: getattr(problem, d) for d in "MNK"}
        share["N"] = problem.out_n  # a GLU program's tile spans output columns
        if problem.ragged:
            share[problem.ragged] = max(1, share[problem.ragged] // problem.G)
        seeds = ((64, 64, 64, 4, 1), (32, 64, 64, 4, 1)) if target.interpreted else (
            (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4))
        return [{"BLOCK_M": clamp(bm, share["M"]), "BLOCK_N": clamp(bn, share["N"]),
                 "BLOCK_K": clamp(bk, share["K"]), "num_warps": w, "num_stages": s}
                for bm, bn, bk, w, s in seeds]

    def context(self, problem: GroupedGemmProblem, params: Params, target: Target) -> dict[str, Any]:
        upcast = target.interpreted and problem.dtype != "fp32"
        epilogue = render_epilogue(problem_epilogue(problem), target.interpreted,
                                   out_dtype=problem.out_dtype)
        # the gate's activation, rendered by the same IR emitter (it updates acc in place)
        glu = render_epilogue(epilogue_expr((EpilogueOp(problem.glu),), ()), target.interpreted) if problem.glu else None
        return dict(
            kernel_name=self.kernel_name, problem_text=problem.describe(),
            params_text=self.space.encode(params), target=target.name, case=problem.case,
            problem_json=problem.to_json(),
            out_torch_dtype=TORCH_DTYPE[problem.out_dtype], n_inputs=len(problem.epilogue_inputs),
            epilogue_code=epilogue.code,
            epilogue_helpers=epilogue.helpers + ("\n\n" + glu.helpers if glu and glu.helpers else ""),
            epilogue_out_value=epilogue.out_value, upcast=upcast,
            glu=bool(problem.glu), glu_code=glu.code if glu else "",
            num_programs=INTERPRETER_PROGRAMS if target.interpreted else target.num_sms,
            dot_kwargs=', input_precision="ieee"' if problem.dtype == "fp32" or upcast else "",
            **params,
        )

    def aot_spec(self, problem: GroupedGemmProblem, params: Params) -> AotSpec:
        """How ``triton.compile`` builds the kernel ahead of time: pointer types, the tile as
        constexprs, every pointer 16-byte aligned (torch allocations are); sizes and strides
        are i32 arguments (the kernel widens a group's base offset to 64 bits itself)."""
        pointers = {"A": TRITON_POINTER[problem.dtype], "B": TRITON_POINTER[problem.dtype],
                    "C": TRITON_POINTER[problem.out_dtype], "OFFS": "*i32"}
        for i, inp in enumerate(problem.epilogue_inputs):
            pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
        constexprs = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
        return AotSpec(self.kernel_name, "triton", pointers, constexprs, tuple(pointers),
                       {"num_warps": params["num_warps"], "num_stages": params["num_stages"]})

    def expected_instructions(self, problem: GroupedGemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        """The MMA a dense GEMM of this tile and dtype uses (templates/triton/gemm.mma_checks)."""
        return mma_checks(problem.as_gemm(), params, target)

    def render_kernel(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=self.id.replace(".", "_"), interpret=target.interpreted,
                              aot=None if target.interpreted else self.aot_spec(problem, params))

"""Persistent Triton grouped GEMM: all four ``_grouped_mm`` shape cases, offsets read on the
device, and the GEMM templates' epilogue hook.

A fixed grid of ``NUM_PROGRAMS`` programs (the target's SM count; 4 under the interpreter)
walks the (group, tile) work items: each program loops over the groups, loads the group's
[start, end) from the int32 end offsets *inside the kernel* (no host sync, so it runs in a CUDA
graph and never waits on the GPU), counts the group's tiles and takes every NUM_PROGRAMS-th
work item. Ragged groups are masked; empty groups have no tiles (2d3d, 3d2d) or an empty K
loop (2d2d: the tile is ``epilogue(0)``). Accumulation is fp32; the epilogue sees
``pid_b`` = the group, so a per-group bias is an epilogue input with a "B" in its pattern.

Parameters: BLOCK_M/BLOCK_N/BLOCK_K, num_warps, num_stages. Under the interpreter bf16 tiles
are upcast to fp32 before ``tl.dot`` (triton issue 11584, as in triton.gemm).
"""

from __future__ import annotations

from typing import Any

from tilewright.errors import UnsupportedProblemError
from tilewright.grouped import GroupedGemmProblem
from tilewright.ir.epilogue import problem_epilogue
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)
from tilewright.templates.triton.epilogue import render_epilogue
from tilewright.templates.triton.gemm import TORCH_DTYPE

INTERPRETER_PROGRAMS = 4  # enough to exercise the persistent stride, few enough to stay quick


class TritonGroupedGemm(TemplateSpec):
    id = "triton.grouped_gemm"
    backend = "triton"
    op = "grouped_gemm"
    jinja = "grouped_gemm.py.jinja"
    kernel_name = "tw_grouped_gemm_kernel"
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of a group's output per work item"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns per work item"),
        Knob("BLOCK_K", powers_of_two(16, 256), 32, "K slice per main-loop step"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4, 5, 6), 3, "software-pipeline depth"),
    ))

    def supports(self, problem: GroupedGemmProblem, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, f"{self.id} runs grouped GEMMs (tilewright.grouped.GroupedGemmProblem)")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"input dtype {problem.dtype} (the grouped template takes fp32/fp16/bf16)")
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        return SUPPORTED

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """Tiles clamped to the per-group sizes (a group's share of the ragged dim)."""
        def clamp(v: int, n: int) -> int:
            p = 16
            while p < n:
                p *= 2
            return min(v, p)
        share = {d: getattr(problem, d) for d in "MNK"}
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
        return dict(
            kernel_name=self.kernel_name, problem_text=problem.describe(),
            params_text=self.space.encode(params), target=target.name, case=problem.case,
            problem_json=problem.to_json(),
            out_torch_dtype=TORCH_DTYPE[problem.out_dtype], n_inputs=len(problem.epilogue_inputs),
            epilogue_code=epilogue.code, epilogue_helpers=epilogue.helpers,
            epilogue_out_value=epilogue.out_value, upcast=upcast,
            num_programs=INTERPRETER_PROGRAMS if target.interpreted else target.num_sms,
            dot_kwargs=', input_precision="ieee"' if problem.dtype == "fp32" or upcast else "",
            **params,
        )

    def render(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        params = self.space.complete(params)
        support = self.supports(problem, target)
        if not support:
            raise UnsupportedProblemError(f"{self.id} cannot run {problem.describe()}: {support.reason}")
        if (why := self.check(params, problem, target)) is not None:
            raise UnsupportedProblemError(f"{self.id} params {dict(params)} on {target.name}: {why}")
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=self.id.replace(".", "_"), interpret=target.interpreted)

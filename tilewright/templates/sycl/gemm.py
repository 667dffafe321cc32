"""The SYCL GEMM template (``sycl.gemm``, the ``xpu`` target): ``out[b] = epilogue(A[b] @ B[b])``
as one free-function ``nd_range`` kernel compiled at run time (:mod:`tilewright.templates.sycl.runtime`).

One work-group per ``BLOCK_M x BLOCK_N`` tile of C (and batch), ``(BLOCK_M / THREAD_M) *
(BLOCK_N / THREAD_N)`` work-items, each accumulating a ``THREAD_M x THREAD_N`` sub-tile in fp32
registers. K is walked ``BLOCK_K`` at a time: the work-group stages the slab of A and of B in
local memory (converted to fp32 once, zero past the ragged edges), synchronises, and every
work-item reads its rows and columns from there. The epilogue is the problem's expression IR
(:func:`tilewright.ir.epilogue.problem_epilogue`: the op kinds or any fused pointwise chain)
rendered by the IR's SYCL emitter over ``acc`` and the epilogue inputs, then rounded once to
the output dtype. Operands and epilogue inputs are read through run-time strides (any layout,
broadcast inputs with stride 0).

A problem that stores its product too (``store_acc``: a training GEMM whose value the backward
needs) writes it beside the epilogue's result, with the leading epilogue kinds it includes
(``acc_after``: an addmm's bias), rounded once to the operand dtype.

Refused (with the reason): block-scaled and fp8 operands, targets other than ``xpu``. No sub-group / XMX (DPAS) matrix instructions
yet: this is the portable tiled kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tilewright.ir import dtypes
from tilewright.ir.epilogue import problem_epilogue
from tilewright.ir.expr import Node
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.sycl.emit import STORAGE, SyclExpr

MAX_WORK_GROUP = 1024  # work-items per group every SYCL device here takes (the CPU device: 8192)


class SyclGemm(TemplateSpec):
    """Tiled GEMM through local memory, fp32 accumulation, the IR epilogue fused."""

    id = "sycl.gemm"
    backend = "sycl"
    op = "gemm"
    jinja = "gemm.py.jinja"
    stores_acc = True
    space = ParamSpace((
        Knob("BLOCK_M", (16, 32, 64, 128), 64, "rows of C per work-group"),
        Knob("BLOCK_N", (16, 32, 64, 128), 64, "columns of C per work-group"),
        Knob("BLOCK_K", (8, 16, 32, 64), 16, "K slab staged in local memory per step"),
        Knob("THREAD_M", (1, 2, 4, 8), 4, "rows of C per work-item"),
        Knob("THREAD_N", (1, 2, 4, 8), 4, "columns of C per work-item"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "sycl.gemm runs GEMM problems")
        if target.backend != "xpu":
            return Support(False, f"SYCL kernels are for the xpu target, not {target.name}")
        if problem.block_scaled or problem.dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"sycl.gemm takes fp32/fp16/bf16 operands, not {problem.dtype}")
        if problem.out_dtype not in STORAGE:
            return Support(False, f"no SYCL store for {problem.out_dtype} outputs")
        for e in problem.epilogue_inputs:
            if e.dtype not in STORAGE:
                return Support(False, f"no SYCL load for {e.dtype} epilogue inputs")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if params["THREAD_M"] > params["BLOCK_M"] or params["THREAD_N"] > params["BLOCK_N"]:
            return "a work-item's sub-tile is larger than the work-group's tile"
        wg = self.work_group(params)
        if wg > MAX_WORK_GROUP:
            return f"{wg} work-items per group (> {MAX_WORK_GROUP}): larger THREAD_M/THREAD_N"
        local = 4 * params["BLOCK_K"] * (params["BLOCK_M"] + params["BLOCK_N"])
        if local > target.smem_per_block:
            return f"the K slabs need {local} bytes of local memory, over the {target.smem_per_block} a group has"
        return None

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        """The policy's candidates (this template's knobs are not the Triton family's): a
        64x64 tile of 16 work-items' 4x4 sub-tiles, a 128x128 one of 8x8 for large C, a 32x32
        one for small or decode-shaped C."""
        out = [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, THREAD_M=4, THREAD_N=4)]
        if problem.M >= 128 and problem.N >= 128:
            out.append(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=16, THREAD_M=8, THREAD_N=8))
        if problem.M < 64 or problem.N < 64:
            out.append(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, THREAD_M=2, THREAD_N=2))
        return [p for p in out if self.check(p, problem, target) is None]

    @staticmethod
    def work_group(params: Params) -> int:
        return (params["BLOCK_M"] // params["THREAD_M"]) * (params["BLOCK_N"] // params["THREAD_N"])

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:

        def load(n: Node) -> str:
            # inputs come broadcast to the output: index every one by (b, m, n), stride 0 where
            # it does not vary, whatever dims its pattern names
            k = int(n.arg[0][1:])
            dt = problem.epilogue_inputs[k].dtype
            v = e.load_value(f"e{k}[pid_b * se{k}_b + m * se{k}_m + n * se{k}_n]", dt)
            return v if dtypes.compute_type(dt) == dtypes.compute_type(n.dtype) else f"float({v})"

        e = SyclExpr(load=load, acc=lambda n: "acc", prefix="ep")
        acc_value = None
        if problem.store_acc:  # the stored product: acc with the epilogue kinds it includes
            stored = dataclasses.replace(problem, epilogue=problem.epilogue[:problem.acc_after],
                                         epilogue_ir="", store_acc=False, acc_after=0)
            acc_value = e.store_value(e.emit(problem_epilogue(stored)), "fp32", problem.dtype)
        value = e.emit(problem_epilogue(problem))
        out_value = e.store_value(value, "fp32", problem.out_dtype)

        def element(ptr: str, index: str, dt: str) -> str:
            return f"float({e.load_value(f'{ptr}[{index}]', dt)})"

        load_a = element("A", "m * sa_m + k * sa_k", problem.dtype)
        load_b = element("B", "k * sb_k + n * sb_n", problem.dtype)  # before helpers(): bf16 needs one
        source = self.render_jinja(
            problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name,
            kernel_name="tw_sycl_gemm", helpers=e.helpers(), epilogue=e.lines, out_value=out_value,
            a_type=STORAGE[problem.dtype], b_type=STORAGE[problem.dtype], c_type=STORAGE[problem.out_dtype],
            load_a=load_a, load_b=load_b, store_acc=problem.store_acc, acc_value=acc_value,
            acc_dtype=f"torch.{str(dtypes.TORCH[problem.dtype]).removeprefix('torch.')}",
            epilogue_inputs=[{"index": k, "type": STORAGE[i.dtype]} for k, i in enumerate(problem.epilogue_inputs)],
            out_dtype=f"torch.{str(dtypes.TORCH[problem.out_dtype]).removeprefix('torch.')}",
            WG=self.work_group(params), **params,
        )
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name="sycl_gemm", meta={"kind": "gemm", "language": "sycl"})

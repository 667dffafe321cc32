"""A jinja template registered from outside tilewright (docs/kernel-authors.md, "Adding a
template (jinja)"): a tiled GEMM with the problem's fused epilogue, in the ``tutorial`` language.

The Python half says which problems it serves (``problem_support``), which parameters are
legal (``check``), what the source is (``render_kernel``, from ``tutorial_gemm.py.jinja`` beside
this file) and what the compiled kernel must contain (``expected_instructions``). The base class
completes the parameters and refuses unsupported problems before ``render_kernel`` runs.
"""

from __future__ import annotations

from typing import Any

import tilewright
from tilewright.ir import dtypes
from tilewright.ir.epilogue import problem_epilogue
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.templates import SUPPORTED, Knob, ParamSpace, RenderedKernel, Support, TemplateSpec
from tilewright.templates.triton.emit import POINTER
from tilewright.templates.triton.epilogue import render_epilogue
from tilewright.templates.triton.gemm import mma_checks

DTYPES = ("fp16", "bf16")


class TutorialGemm(TemplateSpec):
    """out = epilogue(A @ B): A (M, K) row-major, B (K, N) column-major (an nn.Linear weight),
    fp16/bf16 in, fp32 accumulation, any epilogue tilewright fuses (bias, activations, ...)."""

    id = "tutorial.gemm"
    backend = "tutorial"
    op = "gemm"
    jinja = "tutorial_gemm.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (16, 32, 64, 128), 64, "rows of C per program"),
        Knob("BLOCK_N", (16, 32, 64, 128), 64, "columns of C per program"),
        Knob("BLOCK_K", (16, 32, 64, 128), 32, "K slice per step"),
        Knob("num_warps", (1, 2, 4, 8), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4), 3, "software pipeline depth"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "tutorial.gemm runs GEMMs")
        if problem.dtype not in DTYPES or problem.out_dtype not in ("fp32",) + DTYPES:
            return Support(False, f"{problem.dtype} -> {problem.out_dtype} (takes fp16/bf16 inputs)")
        if problem.batched or problem.store_acc or (problem.layout_a, problem.layout_b) != ("row", "col"):
            return Support(False, "2-D GEMMs of a row-major A and a column-major B only")
        return SUPPORTED

    def check(self, params: dict[str, Any], problem: GemmProblem, target: Target) -> str | None:
        if (why := self.space_refusal(params)) is not None:
            return why
        if not target.interpreted and params["BLOCK_M"] * params["BLOCK_N"] < 8 * 32 * params["num_warps"]:
            return "tile too small for the number of warps"
        return None

    def render_kernel(self, problem: GemmProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        epilogue = render_epilogue(problem_epilogue(problem), target.interpreted, None,
                                   out_dtype=problem.out_dtype, stored_dtype=problem.dtype)
        source = self.render_jinja(
            problem_text=problem.describe(), n_inputs=len(problem.epilogue_inputs),
            epilogue_code=epilogue.code, epilogue_helpers=epilogue.helpers,
            out_value=epilogue.out_value, out_dtype=str(dtypes.TORCH[problem.out_dtype]),
            # the Triton interpreter's bf16 dot is wrong (triton issue 11584): go through fp32
            upcast=target.interpreted and problem.dtype == "bf16", **params)
        pointers = {"A": POINTER[problem.dtype], "B": POINTER[problem.dtype], "C": POINTER[problem.out_dtype]}
        pointers.update({f"E{i}": POINTER[e.dtype] for i, e in enumerate(problem.epilogue_inputs)})
        aot = AotSpec("tutorial_gemm_kernel", "triton", pointers,
                      {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")} | {"stride_ak": 1, "stride_bk": 1},
                      tuple(pointers), {"num_warps": params["num_warps"], "num_stages": params["num_stages"]})
        return RenderedKernel(self.id, params, target.name, source, "tutorial_gemm",
                              interpret=target.interpreted, aot=None if target.interpreted else aot)

    def expected_instructions(self, problem: GemmProblem, params: dict[str, Any], target: Target) -> list:
        return mma_checks(problem, params, target)  # wgmma on sm_90a, tcgen05 on sm_100a, ...


TEMPLATE = TutorialGemm()


def register() -> TutorialGemm:
    """Register the language, then the template (again is a no-op)."""
    from tutorial_language import register as register_language

    register_language()
    return tilewright.register_template(TEMPLATE)

"""The ATen candidate for a GEMM problem: ``torch.matmul``/``addmm``/``baddbmm`` and the epilogue
as PyTorch operators. It is the fallback every policy includes and, given float64 inputs, the
reference the autotuner checks other candidates against.
"""

from __future__ import annotations

from tilewright.problem import DTYPES, GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, Params, RenderedKernel, Support, TemplateSpec

_TORCH_NAME = {name: str(dtype).removeprefix("torch.") for name, dtype in DTYPES.items()}


class AtenGemm(TemplateSpec):
    id = "aten.gemm"
    backend = "aten"
    op = "gemm"
    jinja = "gemm.py.jinja"

    def supports(self, problem: GemmProblem, target: Target) -> Support:
        if problem.block_scaled and (problem.dtype != "nvfp4" or problem.scale_layout != "row"):
            return Support(False, "ATen path dequantises NVFP4 with row-major scales only")
        return SUPPORTED

    def render(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        ops = [{
            "kind": op.kind, "input": op.input, "scale": op.scale, "reverse": op.reverse,
            "scalar_text": repr(float(op.scalar)) if op.scalar is not None else "",
        } for op in problem.epilogue]
        addmm = None
        first = problem.epilogue[0] if problem.epilogue else None
        if (first is not None and not problem.block_scaled and first.kind == "add" and first.input is not None
                and problem.epilogue_inputs[first.input].dtype == problem.dtype):
            # addmm/baddbmm need the bias in the operands' dtype; otherwise promote as eager does
            addmm, ops = ops[0], ops[1:]
        source = self.render_jinja(
            problem_text=problem.describe(),
            out_torch_dtype=_TORCH_NAME[problem.out_dtype],
            block_scaled=problem.block_scaled,
            addmm=addmm,
            epilogue=ops,
        )
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="aten_gemm")

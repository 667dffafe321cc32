"""The ATen candidate for a grouped GEMM: ``torch._grouped_mm`` and the epilogue as PyTorch
operators. The fallback every grouped policy includes and, given float64 operands, the reference
(``_grouped_mm`` has no float64 path: the reference loops over groups with ``torch.matmul``).

A block-scaled problem (``F.scaled_grouped_mm``'s recipes) is dequantised with torch first
(:func:`tilewright.quant.dequantize_block_scaled`: exact in bf16, fp32 and float64), then
multiplied the same way; NVFP4's per-group alpha scales each row's accumulator before the gated
product and the epilogue."""

from __future__ import annotations

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.problem import DTYPES, EpilogueOp
from tilewright.runtime.targets import Target
from tilewright.templates.aten.gemm import torch_epilogue
from tilewright.templates.base import SUPPORTED, Params, RenderedKernel, Support, TemplateSpec

_TORCH_NAME = {name: str(dtype).removeprefix("torch.") for name, dtype in DTYPES.items()}


class AtenGroupedGemm(TemplateSpec):
    id = "aten.grouped_gemm"
    backend = "aten"
    op = "grouped_gemm"
    jinja = "grouped_gemm.py.jinja"
    fuses_glu = True  # renders problem.glu

    def problem_support(self, problem: GroupedGemmProblem, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, f"{self.id} runs grouped GEMMs (tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem)")
        return SUPPORTED

    def render_kernel(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        has_epilogue = bool(problem.epilogue or problem.epilogue_ir)
        source = self.render_jinja(
            problem_text=problem.describe(), problem_json=problem.to_json(),
            out_torch_dtype=_TORCH_NAME[problem.out_dtype],
            epilogue=torch_epilogue(problem_epilogue(problem)) if has_epilogue else [],
            # a fused gated product (problem.glu): the gate's activation, as PyTorch operators
            glu=torch_epilogue(epilogue_expr((EpilogueOp(problem.glu),), ())) if problem.glu else [],
            block_scaled=problem.block_scaled, fmt=problem.dtype, global_scales=problem.global_scales,
        )
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="aten_grouped_gemm")

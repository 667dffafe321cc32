"""The ATen candidate for a GEMM problem: ``torch.matmul``/``addmm``/``baddbmm`` and the epilogue
as PyTorch operators. It is the fallback every policy includes and, given float64 inputs, the
reference the autotuner checks other candidates against.
"""

from __future__ import annotations

from tilewright.ir import expr as E
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.ir.ops import OPS
from tilewright.problem import DTYPES, GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, Params, RenderedKernel, Support, TemplateSpec

_TORCH_NAME = {name: str(dtype).removeprefix("torch.") for name, dtype in DTYPES.items()}


def torch_epilogue(value: E.Node) -> list[str]:
    """Statements updating ``acc`` (a tensor) to the epilogue's ``value``, the IR rendered as
    PyTorch operators: each op by its meaning in :data:`tilewright.ir.ops.OPS` (the ``T``
    table), epilogue input ``k`` as ``epilogue_inputs[k]`` (broadcast by the caller). Narrow
    floats are computed in fp32, as the generated kernels do; a float64 ``acc`` (the
    reference) stays float64."""
    lines = ["acc = acc.float() if acc.dtype in (torch.float16, torch.bfloat16) else acc"]
    names: dict[E.Node, str] = {}
    for n in E.toposort([value]):
        args = [names[s] for s in n.src]
        if n.op == "acc":
            names[n] = "acc"
            continue
        if n.op == "const":  # a 0-d tensor: torch functions want a tensor operand first
            text = repr(float(n.arg)) if n.arg == n.arg and abs(n.arg) != float("inf") else f"float('{n.arg}')"
            code = f"torch.tensor({text}, dtype=acc.dtype, device=acc.device)"
        elif n.op == "load":
            code = f"epilogue_inputs[{int(n.arg[0][1:])}].to(acc.dtype)"
        elif n.op == "cast":
            code = args[0]  # epilogue values are all held in acc's dtype
        elif n.op in OPS:
            code = f"T[{n.op!r}]({', '.join(args)})"
        else:
            raise ValueError(f"an epilogue has no {n.op} values")
        names[n] = f"v{len(lines)}"
        lines.append(f"{names[n]} = {code}")
    return lines + [f"acc = {names[value]}"]


def _epilogue_lines(ops: list, problem: GemmProblem) -> list[str]:
    return torch_epilogue(epilogue_expr(ops, problem.epilogue_inputs)) if ops else []


class AtenGemm(TemplateSpec):
    id = "aten.gemm"
    backend = "aten"
    op = "gemm"
    jinja = "gemm.py.jinja"

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if problem.block_scaled and problem.scale_layout != "row":
            return Support(False, "ATen path dequantises block-scaled operands with row-major scales only")
        return SUPPORTED

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        ops = list(problem.epilogue)
        addmm = None
        first = ops[0] if ops else None
        if (first is not None and not problem.block_scaled and (not problem.store_acc or problem.acc_after)
                and first.kind == "add"
                and first.input is not None
                and problem.epilogue_inputs[first.input].dtype == problem.dtype):
            # addmm/baddbmm need the bias in the operands' dtype; otherwise promote as eager does
            addmm, ops = {"input": first.input, "scale": first.scale}, ops[1:]
        source = self.render_jinja(
            problem_text=problem.describe(),
            out_torch_dtype=_TORCH_NAME[problem.out_dtype],
            acc_torch_dtype=_TORCH_NAME.get(problem.dtype, "float32"), store_acc=problem.store_acc,
            block_scaled=problem.block_scaled, fmt=problem.dtype,
            addmm=addmm,
            prologue=[] if not problem.store_acc else _epilogue_lines(
                ops[:problem.acc_after - (1 if addmm else 0)], problem),
            epilogue=(torch_epilogue(problem_epilogue(problem)) if problem.epilogue_ir
                      else _epilogue_lines(ops[problem.acc_after - (1 if addmm else 0):] if problem.store_acc
                                           else ops, problem)),
        )
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="aten_gemm")

"""The ATen candidate for a GEMM problem: ``torch.matmul``/``addmm``/``baddbmm`` and the epilogue
as PyTorch operators. It is the fallback every policy includes and, given float64 inputs, the
reference the autotuner checks other candidates against.
"""

from __future__ import annotations

import math

from tilewright.ir import expr as E
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.ir.ops import OPS
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import DTYPES
from tilewright.runtime.targets import Target
from tilewright.templates.base import SUPPORTED, Params, RenderedKernel, Support, TemplateSpec

_TORCH_NAME = {name: str(dtype).removeprefix("torch.") for name, dtype in DTYPES.items()}


def torch_epilogue(value: E.Node) -> list[str]:
    """Statements updating ``acc`` (a tensor) to the epilogue's ``value``, the IR rendered as
    PyTorch operators: each op by its meaning in :data:`tilewright.ir.ops.OPS` (the ``T``
    table), epilogue input ``k`` as ``epilogue_inputs[k]`` (broadcast by the caller). Narrow
    floats are computed in fp32, as the generated kernels do; a float64 ``acc`` (the
    reference) stays float64. The module must define ``_const(value, like)`` (see
    ``templates/common/torch_const.py.jinja``)."""
    lines = ["acc = acc.float() if acc.dtype in (torch.float16, torch.bfloat16) else acc"]
    names: dict[E.Node, str] = {}
    for n in E.toposort([value]):
        args = [names[s] for s in n.src]
        if n.op == "acc":
            names[n] = "acc"
            continue
        if n.op == "const":  # a 0-d tensor (torch functions want a tensor operand first), made
            # once per dtype and device by the module's ``_const``, not per call
            text = repr(float(n.arg)) if n.arg == n.arg and abs(n.arg) != float("inf") else f"float('{n.arg}')"
            code = f"_const({text}, acc)"
        elif n.op == "load":  # converted only when its dtype is not acc's (a no-op .to is a call)
            k = int(n.arg[0][1:])
            code = f"(e if (e := epilogue_inputs[{k}]).dtype == acc.dtype else e.to(acc.dtype))"
        elif n.op == "cast":
            code = args[0]  # epilogue values are all held in acc's dtype
        elif n.op in OPS:
            code = f"T[{n.op!r}]({', '.join(args)})"
        else:
            raise ValueError(f"an epilogue has no {n.op} values")
        names[n] = f"v{len(lines)}"
        lines.append(f"{names[n]} = {code}")
    return lines + [f"acc = {names[value]}"]


# the unary epilogue kinds as the one torch op eager calls for them (one call, not the formula's
# five to ten: on a CPU each is a dispatch)
_NATIVE_UNARY = {"relu": "torch.relu(acc)", "gelu": "torch.nn.functional.gelu(acc)",
                 "gelu_tanh": "torch.nn.functional.gelu(acc, approximate='tanh')",
                 "silu": "torch.nn.functional.silu(acc)", "sigmoid": "torch.sigmoid(acc)",
                 "tanh": "torch.tanh(acc)"}
_NATIVE_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def native_epilogue(ops: list) -> list[str] | None:
    """Statements updating ``acc`` for an op list, each op as the torch call eager makes for it
    (None when an op has no such form). Same values as :func:`torch_epilogue` of its IR, which
    defines each kind by the formula eager computes."""
    lines = ["acc = acc.float() if acc.dtype in (torch.float16, torch.bfloat16) else acc"]
    for op in ops:
        if op.kind in _NATIVE_UNARY:
            lines.append(f"acc = {_NATIVE_UNARY[op.kind]}")
            continue
        if op.kind not in _NATIVE_BINARY:
            return None
        if op.input is not None:
            other = f"(e if (e := epilogue_inputs[{op.input}]).dtype == acc.dtype else e.to(acc.dtype))"
            if op.scale != 1.0:
                other = f"({other} * {float(op.scale)!r})"
        else:
            other = repr(float(op.scalar)) if math.isfinite(op.scalar) else f"float('{op.scalar}')"
        sym = _NATIVE_BINARY[op.kind]
        lines.append(f"acc = {other} {sym} acc" if op.reverse and op.kind in ("sub", "div")
                     else f"acc = acc {sym} {other}")
    return lines


def _epilogue_lines(ops: list, problem: GemmProblem) -> list[str]:
    if not ops:
        return []
    native = native_epilogue(ops)
    return native if native is not None else torch_epilogue(epilogue_expr(ops, problem.epilogue_inputs))


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
        epilogue = (torch_epilogue(problem_epilogue(problem)) if problem.epilogue_ir
                    else _epilogue_lines(ops[problem.acc_after - (1 if addmm else 0):] if problem.store_acc
                                         else ops, problem))
        linear = (problem.dtype in ("fp32", "fp16", "bf16") and not problem.store_acc
                  and (addmm is None or addmm["scale"] == 1.0))
        source = self.render_jinja(
            problem_text=problem.describe(),
            out_torch_dtype=_TORCH_NAME[problem.out_dtype],
            acc_torch_dtype=_TORCH_NAME.get(problem.dtype, "float32"), store_acc=problem.store_acc,
            block_scaled=problem.block_scaled, fmt=problem.dtype,
            addmm=addmm,
            # a linear's weight as it is (GemmNode.b_t): one call where launch's product is two
            linear=linear,
            # nothing but the product in the operands' dtype: ATen's entries serve the call as
            # they are (the kernel call skips a Python frame; ~45 such GEMMs in a training step)
            plain=linear and addmm is None and not epilogue and problem.out_dtype == problem.dtype,
            prologue=[] if not problem.store_acc else _epilogue_lines(
                ops[:problem.acc_after - (1 if addmm else 0)], problem),
            epilogue=epilogue,
        )
        return RenderedKernel(template_id=self.id, params={}, target=target.name, source=source,
                              name="aten_gemm")

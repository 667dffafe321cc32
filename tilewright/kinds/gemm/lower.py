"""The GEMM kind's FX lowering: GEMM-family calls with float operands on one device become
:class:`~tilewright.kinds.gemm.node.GemmNode`\\ s (the kind's :meth:`~tilewright.kinds.gemm.kind.GemmKind.lower`
hook): ``mm``, ``addmm`` (bias as the first epilogue step, ``alpha``/``beta`` as scales), ``bmm``,
``baddbmm``, fp8 ``_scaled_mm`` (its scales and bias as epilogue steps) and NVFP4
``tilewright.nvfp4_mm`` and MXFP4 ``tilewright.mx_mm`` (packed operands with block scales; alpha
and bias in the epilogue). Transposed or sliced operands stay views: the GEMM reads them through
their strides, nothing is copied. A call that does not fit stays ATen's
(:mod:`tilewright.compiler.lower`). It moved here from :mod:`tilewright.compiler.lower` (issue
30), whose old names resolve for one release with a DeprecationWarning.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import TensorMeta, layout_of
from tilewright.compiler.lower import is_op
from tilewright.kinds.gemm.node import GemmNode
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES, VALUES_PER_BYTE, EpilogueInput, EpilogueOp

aten = torch.ops.aten
# the public block-scaled ops (tilewright.kernels, the layer above the compiler) by name: a graph
# holding one was traced from a call of it, so it is registered; the compiler never imports them
NVFP4_MM = "tilewright::nvfp4_mm"
MX_MM = "tilewright::mx_mm"

GEMM_OPS = {
    aten.mm.default: "mm",
    aten.addmm.default: "addmm",
    aten.bmm.default: "bmm",
    aten.baddbmm.default: "baddbmm",
}


@dataclass
class FusedInput:
    """A tensor the epilogue reads: the value's name, its broadcast pattern, and in which shape
    space it broadcasts ("gemm": the GEMM's (batch?, M, N); "view": the absorbed view's)."""

    value: str
    pattern: EpilogueInput
    space: str = "gemm"


def _gemm_operands(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None, float, float] | None:
    """(A, B, bias-or-None, alpha, beta) of a GEMM-family node."""
    op = GEMM_OPS[node.target]
    args = list(node.args)
    alpha = float(node.kwargs.get("alpha", 1))
    beta = float(node.kwargs.get("beta", 1))
    if op in ("mm", "bmm"):
        return args[0], args[1], None, 1.0, 1.0
    return args[1], args[2], args[0], alpha, beta


def why_not_gemm(node: fx.Node) -> str | None:
    """Why this GEMM-family node stays on ATen (None when it lowers)."""
    operands = _gemm_operands(node)
    if operands is None:
        return "unrecognised arguments"
    a, b, bias, alpha, beta = operands
    if alpha == 0 or (bias is not None and beta == 0):
        # BLAS semantics: a zero scale skips its term entirely (NaN in A times 0 is not NaN)
        return "a zero alpha or beta (the BLAS skips that term; ATen does the same)"
    metas = [TensorMeta.of(x) for x in (a, b, node)]
    if any(m is None for m in metas):
        return "operands without tensor metadata"
    ma, mb, mo = metas
    if ma.dtype != mb.dtype:
        return f"mixed operand dtypes {ma.dtype} and {mb.dtype}"
    if DTYPE_NAMES.get(ma.dtype) not in GEMM_INPUT_DTYPES:
        return f"dtype {ma.dtype} (tilewright lowers fp32/fp16/bf16 GEMMs)"
    if ma.device != mb.device or ma.device != mo.device:
        return "operands on different devices"
    if bias is not None:
        mbias = TensorMeta.of(bias)
        if mbias is None or mbias.device != ma.device or DTYPE_NAMES.get(mbias.dtype) not in GEMM_INPUT_DTYPES:
            return "bias that is not a float tensor on the operands' device"
    return None


def broadcast_pattern(operand: TensorMeta, space: tuple, batched: bool, dims_for_space) -> str | None:
    """The EpilogueInput pattern of ``operand`` broadcast against ``space`` (a shape tuple);
    None when it does not broadcast to it."""
    if operand.ndim > len(space):
        return None
    varies = set()
    offset = len(space) - operand.ndim
    for i, size in enumerate(operand.shape):
        target = space[offset + i]
        if size == 1:
            continue
        if size != target:
            return None
        varies.add(dims_for_space(offset + i))
    order = ("B", "M", "N") if batched else ("M", "N")
    return "".join(d for d in order if d in varies)


def lower_gemm(node: fx.Node, index: int) -> GemmNode:
    a, b, bias, alpha, beta = _gemm_operands(node)  # type: ignore[misc]
    ma, mb, mo = TensorMeta.of(a), TensorMeta.of(b), TensorMeta.of(node)
    assert ma is not None and mb is not None and mo is not None
    batched = mo.ndim == 3
    g = GemmNode(
        name=f"gemm_{index}", fx_nodes=[node], op=GEMM_OPS[node.target], a=a.name, b=b.name,
        M=ma.shape[-2], N=mb.shape[-1], K=ma.shape[-1],
        batch=mo.shape[0] if batched else sympy.Integer(1),
        hints={"M": ma.hint_shape[-2], "N": mb.hint_shape[-1], "K": ma.hint_shape[-1],
               "batch": mo.hint_shape[0] if batched else 1},
        batched=batched, dtype=ma.dtype, out_dtype=mo.dtype, device=mo.device,
        layout_a=layout_of(ma), layout_b=layout_of(mb), value=node.name,
    )
    if alpha != 1.0:
        g.epilogue.append(EpilogueOp("mul", scalar=alpha))
    if bias is not None and beta != 0.0:
        mbias = TensorMeta.of(bias)
        assert mbias is not None
        dims = ("B", "M", "N") if batched else ("M", "N")
        pattern = broadcast_pattern(mbias, mo.shape, batched, lambda i: dims[i])
        assert pattern is not None, "addmm bias must broadcast to the output"
        g.epilogue_inputs.append(FusedInput(bias.name, EpilogueInput(pattern, DTYPE_NAMES[mbias.dtype])))
        g.epilogue.append(EpilogueOp("add", input=len(g.epilogue_inputs) - 1, scale=beta))
    return g


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def lower_scaled_mm(node: fx.Node, index: int) -> GemmNode | None:
    """``_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype)`` with fp8 operands
    and tensor-wise or row/column-wise fp32 scales: a GEMM whose epilogue multiplies by the
    two scales and adds the bias. None when it stays on ATen (fp8 output scaling)."""
    names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if bound.get("scale_result") is not None:
        return None
    a, b = bound["self"], bound["mat2"]
    ma, mb, mo = TensorMeta.of(a), TensorMeta.of(b), TensorMeta.of(node)
    if None in (ma, mb, mo) or ma.dtype != mb.dtype or ma.dtype not in FP8_DTYPES:
        return None
    if mo.dtype not in (torch.float32, torch.float16, torch.bfloat16) or ma.ndim != 2:
        return None
    g = GemmNode(
        name=f"gemm_{index}", fx_nodes=[node], op="scaled_mm", a=a.name, b=b.name,
        M=ma.shape[0], N=mb.shape[1], K=ma.shape[1],
        hints={"M": ma.hint_shape[0], "N": mb.hint_shape[1], "K": ma.hint_shape[1], "batch": 1},
        dtype=ma.dtype, out_dtype=mo.dtype, device=mo.device,
        layout_a=layout_of(ma), layout_b=layout_of(mb), value=node.name)
    for key, op in (("scale_a", "mul"), ("scale_b", "mul"), ("bias", "add")):
        t = bound.get(key)
        if t is None:
            continue
        mt = TensorMeta.of(t)
        if mt is None or mt.device != mo.device or DTYPE_NAMES.get(mt.dtype) not in GEMM_INPUT_DTYPES:
            return None
        pattern = broadcast_pattern(mt, mo.shape, False, lambda i: ("M", "N")[i])
        if pattern is None:
            return None
        g.epilogue_inputs.append(FusedInput(t.name, EpilogueInput(pattern, DTYPE_NAMES[mt.dtype])))
        g.epilogue.append(EpilogueOp(op, input=len(g.epilogue_inputs) - 1))
    return g


def lower_block_scaled_mm(node: fx.Node, index: int, fmt: str, a: fx.Node, a_scale: fx.Node,
                          b: fx.Node, b_scale: fx.Node, scalars: tuple, bias, values_per_byte: int
                          ) -> GemmNode | None:
    """One GEMM on packed block-scaled operands (A (M, K/vpb), B stored (N, K/vpb), row-major
    block scales) whose epilogue multiplies by each of ``scalars`` (0-dim fp32 values or None)
    and adds the bias; later epilogue steps fuse after those as usual. None when a traced
    shape is missing (the call then stays on ATen)."""
    ma, mb, mo = TensorMeta.of(a), TensorMeta.of(b), TensorMeta.of(node)
    if None in (ma, mb, mo) or ma.ndim != 2 or mb.ndim != 2:
        return None
    K, K_hint = ma.shape[1] * values_per_byte, ma.hint_shape[1] * values_per_byte
    g = GemmNode(
        name=f"gemm_{index}", fx_nodes=[node], op=node.target._opname, a=a.name, b=b.name,
        M=ma.shape[0], N=mb.shape[0], K=K,
        hints={"M": ma.hint_shape[0], "N": mb.hint_shape[0], "K": K_hint, "batch": 1},
        dtype=torch.uint8, out_dtype=mo.dtype, device=mo.device, layout_a="row", layout_b="col",
        value=node.name, fmt=fmt, scales=(a_scale.name, b_scale.name), scale_layout="row")
    for t, op, pattern in [*((s, "mul", "") for s in scalars), (bias, "add", "N")]:
        if t is None:
            continue
        mt = TensorMeta.of(t)
        g.epilogue_inputs.append(FusedInput(t.name, EpilogueInput(pattern, DTYPE_NAMES[mt.dtype])))
        g.epilogue.append(EpilogueOp(op, input=len(g.epilogue_inputs) - 1))
    return g


def lower_nvfp4_mm(node: fx.Node, index: int) -> GemmNode | None:
    """``tilewright.nvfp4_mm(a, a_scale, a_gs, b, b_scale, b_gs, bias, out_dtype)``: one GEMM on
    packed NVFP4 operands whose epilogue multiplies by both global scales (alpha) and adds the
    bias."""
    a, a_scale, a_gs, b, b_scale, b_gs, bias, _ = node.args
    return lower_block_scaled_mm(node, index, "nvfp4", a, a_scale, b, b_scale, (a_gs, b_gs), bias, 2)


def lower_mx_mm(node: fx.Node, index: int) -> GemmNode | None:
    """``tilewright.mx_mm(a, a_scale, b, b_scale, alpha, bias, fmt, out_dtype)``: one
    ``GemmProblem(dtype=fmt, layout_b="col", scale_layout="row")`` whose epilogue multiplies by
    alpha (when given) and adds the bias."""
    a, a_scale, b, b_scale, alpha, bias, fmt, _ = node.args
    if fmt not in VALUES_PER_BYTE:
        return None
    return lower_block_scaled_mm(node, index, fmt, a, a_scale, b, b_scale, (alpha,), bias, VALUES_PER_BYTE[fmt])


def lower_node(node: fx.Node, index: int) -> GemmNode | None:
    """The GEMM node of FX ``node`` (``index``: GEMMs lowered before it in this graph, its name
    ``gemm_<index>``), or None when it is no GEMM-family call or stays ATen's."""
    if node.target in GEMM_OPS:
        return lower_gemm(node, index) if why_not_gemm(node) is None else None
    if node.target == aten._scaled_mm.default:
        return lower_scaled_mm(node, index)
    if is_op(node.target, NVFP4_MM):
        return lower_nvfp4_mm(node, index)
    if is_op(node.target, MX_MM):
        return lower_mx_mm(node, index)
    return None

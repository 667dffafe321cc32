"""Lowering: ATen FX graph → :class:`KernelGraph`.

GEMM-family nodes with float operands on one device become :class:`GemmNode`s: ``mm``,
``addmm`` (bias as the first epilogue step, ``alpha``/``beta`` as scales), ``bmm``,
``baddbmm``, fp8 ``_scaled_mm`` (its scales and bias as epilogue steps) and NVFP4
``tilewright.nvfp4_mm`` and MXFP4 ``tilewright.mx_mm`` (packed operands with block scales; alpha
and bias in the epilogue). Transposed or sliced operands stay views: the GEMM reads them through their
strides, nothing is copied. Every other call is offered to the registered problem kinds
(:mod:`tilewright.kinds`: each may first rewrite the FX graph, then take nodes as kernels of its
own, e.g. a ``_grouped_mm`` becomes a grouped-GEMM :class:`~tilewright.compiler.graph.KernelNode`);
what none takes becomes an :class:`ExternNode`, run as ATen, so an op tilewright cannot lower never
fails the model.
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import (
    ExternNode, FusedInput, GemmNode, KernelGraph, Node, TensorMeta, layout_of,
)
from tilewright.compiler.fallbacks import contain
from tilewright.compiler.views import fold_double_transposes
from tilewright.kinds import kinds
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES, VALUES_PER_BYTE, EpilogueInput, EpilogueOp

aten = torch.ops.aten
# the public block-scaled ops (tilewright.kernels, the layer above the compiler) by name: a graph
# holding one was traced from a call of it, so it is registered; the compiler never imports them
NVFP4_MM = "tilewright::nvfp4_mm"
MX_MM = "tilewright::mx_mm"


def is_op(target, name: str) -> bool:
    """Whether an FX node's target is the default overload of the custom op ``name``."""
    return isinstance(target, torch._ops.OpOverload) and target.name() == name

GEMM_OPS = {
    aten.mm.default: "mm",
    aten.addmm.default: "addmm",
    aten.bmm.default: "bmm",
    aten.baddbmm.default: "baddbmm",
}
# ops that make a view (or alias) of their input: free, nothing is launched or moved
VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor, aten.select.int,
    aten.alias.default, aten.detach.default, aten.split.Tensor, aten.split_with_sizes.default,
    aten.unbind.int, aten.as_strided.default, aten._reshape_alias.default, aten.view.dtype,
    aten.diagonal.default, aten.unfold.default,
}


def _kind(node: fx.Node, registered: list) -> str:
    """What an ATen call left as it is does, for reports: a view, a getitem, the label of the
    kind whose op it is (:meth:`~tilewright.kinds.ProblemKind.extern_label`), else "extern"."""
    if node.target in VIEWS:
        return "view"
    if node.target is operator.getitem:
        return "getitem"
    return next((label for kind in registered if (label := kind.extern_label(node))), "extern")


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


def _contained(fn, node: fx.Node, *args):
    """``fn(node, *args)``, or None (the node stays an ATen call) if lowering it raised: a
    lowering bug costs that node, not the graph (:mod:`tilewright.compiler.fallbacks`)."""
    try:
        return fn(node, *args)
    except Exception as e:  # noqa: BLE001 - contained to this node
        contain(e, node.name, "lower", f"lowering {node.target}")
        return None


def _lower_by_kind(registered: list, node: fx.Node, counts: dict[int, int]) -> Node | None:
    """The node a registered problem kind makes of ``node`` (the first that takes it), or None."""
    for kind in registered:
        made = _contained(kind.lower, node, counts.get(id(kind), 0))
        if made is not None:
            counts[id(kind)] = counts.get(id(kind), 0) + 1
            return made
    return None


def lower(gm: fx.GraphModule) -> KernelGraph:
    """The kernel IR of an ATen FX graph (one node per FX call; fusion comes after)."""
    placeholders: list[fx.Node] = []
    nodes: list[Node] = []
    output = None
    n_gemm = 0
    registered = kinds()
    fold_double_transposes(gm)  # t(t(x)) is x: one Python call less per transpose (views.py)
    for kind in registered:  # e.g. grouped GEMMs retargeted, their epilogues folded into them
        kind.rewrite_fx(gm)
    lowered_by: dict[int, int] = {}  # kinds' own nodes so far (their index)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node)
        elif node.op == "output":
            output = node
        elif node.op == "call_function" and node.target in GEMM_OPS and why_not_gemm(node) is None and (
                gemm := _contained(lower_gemm, node, n_gemm)) is not None:
            nodes.append(gemm)
            n_gemm += 1
        elif node.op == "call_function" and node.target == aten._scaled_mm.default and (
                scaled := _contained(lower_scaled_mm, node, n_gemm)) is not None:
            nodes.append(scaled)
            n_gemm += 1
        elif node.op == "call_function" and is_op(node.target, NVFP4_MM) and (
                fp4 := _contained(lower_nvfp4_mm, node, n_gemm)) is not None:
            nodes.append(fp4)
            n_gemm += 1
        elif node.op == "call_function" and is_op(node.target, MX_MM) and (
                mxn := _contained(lower_mx_mm, node, n_gemm)) is not None:
            nodes.append(mxn)
            n_gemm += 1
        elif node.op == "call_function" and (other := _lower_by_kind(registered, node, lowered_by)) is not None:
            nodes.append(other)
        elif node.op == "call_function":
            nodes.append(ExternNode(node.name, [node], kind=_kind(node, registered)))
        elif node.op == "get_attr":
            nodes.append(ExternNode(node.name, [node], kind="constant"))
        else:
            raise NotImplementedError(f"FX node kind {node.op} ({node.format_node()})")
    assert output is not None, "FX graph without an output node"
    return KernelGraph(placeholders, nodes, output)


def lower_loop_nodes(kg: KernelGraph, gm: fx.GraphModule, skip: set[str] = frozenset()) -> int:
    """Replace the ATen calls that have an IR rule (pointwise ops, reductions, gathers) by loop
    nodes, in place; views stay ATen calls for whoever still needs them as tensors (and are
    removed when nobody does). FX nodes named in ``skip`` stay ATen calls. Returns the number
    of loop nodes made."""
    from tilewright.compiler.graph import LoopNode
    from tilewright.kinds.loop.lower import lower_loops

    # what a GEMM or another kind's kernel computes is theirs, never a loop node's
    kernel_fx = {f.name for k in kg.kernels for f in k.fx_nodes} | set(skip)
    loops, values = lower_loops(gm, skip=kernel_fx)
    by_fx: dict[str, list[LoopNode]] = {}
    for ln in loops.values():
        by_fx.setdefault(ln.fx_nodes[0].name, []).append(ln)
    nodes: list[Node] = []
    for n in kg.nodes:
        if isinstance(n, ExternNode) and n.fx_node.name in by_fx:
            nodes.extend(by_fx[n.fx_node.name])
        elif (isinstance(n, ExternNode) and n.fx_node.target is operator.getitem
              and isinstance(n.fx_node.args[0], fx.Node) and n.fx_node.args[0].name in by_fx):
            continue  # the loop node computing this output carries the getitem's name
        else:
            nodes.append(n)
    kg.nodes = nodes
    return len(loops)

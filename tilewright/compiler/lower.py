"""Lowering: ATen FX graph → :class:`KernelGraph`.

Every call is offered to the registered problem kinds, in registration order
(:mod:`tilewright.kinds`: each may first rewrite the FX graph, then take nodes as kernels of its
own: GEMM-family calls become :class:`~tilewright.kinds.gemm.node.GemmNode`\\ s,
:mod:`tilewright.kinds.gemm.lower`; a ``_grouped_mm`` becomes a grouped-GEMM
:class:`~tilewright.compiler.graph.KernelNode`); what none takes becomes an :class:`ExternNode`,
run as ATen, so an op tilewright cannot lower never fails the model.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from tilewright._moved import moved_names
from tilewright.compiler.graph import ExternNode, KernelGraph, Node
from tilewright.compiler.fallbacks import contain
from tilewright.compiler.views import fold_double_transposes
from tilewright.kinds import kinds

aten = torch.ops.aten
# the GEMM kind's lowering, which lived here (kept for one release, with a DeprecationWarning)
_MOVED = {name: "tilewright.kinds.gemm.lower" for name in (
    "GEMM_OPS", "NVFP4_MM", "MX_MM", "FP8_DTYPES", "why_not_gemm", "broadcast_pattern", "lower_gemm",
    "lower_scaled_mm", "lower_block_scaled_mm", "lower_nvfp4_mm", "lower_mx_mm", "_gemm_operands")}


def is_op(target, name: str) -> bool:
    """Whether an FX node's target is the default overload of the custom op ``name``."""
    return isinstance(target, torch._ops.OpOverload) and target.name() == name


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


__getattr__ = moved_names(__name__, _MOVED)

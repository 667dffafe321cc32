"""Linear weights read in place: a CPU GEMM whose B is a transposed 2-D tensor takes the tensor.

A traced ``nn.Linear`` is ``addmm(bias, x, t(w))``: the ``t`` is a view, free on a GPU inside a
fused graph, but on a CPU each view is an ATen call the wrapper makes from Python, every call
(one per linear; Inductor makes the same ``reinterpret_tensor`` call). After the epilogue fusion,
:func:`fold_weight_transposes` points each such GEMM's B at ``w`` itself and marks it
(``GemmNode.b_t``); the wrapper then passes ``w`` and the ``t`` node, unused, is dead code.
The GEMM's kernel call (:meth:`~tilewright.kinds.gemm.kind.GemmKind.invoker`) hands ``w`` to a
launcher that takes a weight (a ``linear`` entry: oneDNN's inner product wants exactly that)
and ``w.t()`` to every other launcher, so nothing changes for them: the same view, made one
level down.

Folded: ``aten.t``, ``transpose`` of the two dims and ``permute([1, 0])`` of a 2-D tensor,
feeding a GEMM that is not batched, not block-scaled, on the CPU.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from tilewright.compiler.graph import ExternNode, KernelGraph, TensorMeta
from tilewright.kinds.gemm.node import gemm_nodes

aten = torch.ops.aten


def transposed_source(node: fx.Node) -> fx.Node | None:
    """``w`` when ``node`` is ``w.t()`` of a 2-D ``w`` (``t``, ``transpose(0, 1)``,
    ``permute([1, 0])``, negative dims included), else None."""
    if not node.args or not isinstance(node.args[0], fx.Node) or node.kwargs:
        return None
    src = node.args[0]
    meta = TensorMeta.of(src)
    if meta is None or meta.ndim != 2:
        return None
    if node.target is aten.t.default and len(node.args) == 1:
        return src
    if node.target is aten.transpose.int and len(node.args) == 3:
        dims = {int(d) % 2 for d in node.args[1:]}
        return src if dims == {0, 1} else None
    if node.target is aten.permute.default and len(node.args) == 2:
        return src if [int(d) % 2 for d in node.args[1]] == [1, 0] else None
    return None


def fold_weight_transposes(kg: KernelGraph) -> int:
    """Point every eligible GEMM's B at the tensor it transposes (see the module docstring), in
    place. Returns how many GEMMs now take their B as ``w``."""
    views = {n.name: n for n in kg.nodes if isinstance(n, ExternNode) and n.fx_node.op == "call_function"}
    folded = 0
    for g in gemm_nodes(kg):
        if g.b_t or g.batched or g.fmt or g.scales or g.device.type != "cpu" or g.b not in views:
            continue
        src = transposed_source(views[g.b].fx_node)
        if src is None:
            continue
        g.b, g.b_t = src.name, True
        folded += 1
    return folded


__all__ = ["fold_weight_transposes", "transposed_source"]

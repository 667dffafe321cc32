"""View clean-ups on the ATen FX graph before lowering.

aot_autograd's backward graphs are full of transposes of transposes: a linear layer's weight
enters the backward as ``t(t(w))`` (the forward's ``t`` saved, transposed back for the input's
gradient), and a weight's gradient leaves as ``t(t(mm))``. Each ``t`` is a Python call of its own in
the wrapper (and in the decomposed graph the race compares with): ~2 us, some 50 per call of
the demo Llama's backward. ``t(t(x))`` is ``x`` itself, same sizes, strides and storage offset,
so its uses read ``x`` directly.
"""

from __future__ import annotations

import torch
import torch.fx as fx

_T = torch.ops.aten.t.default


def fold_double_transposes(gm: fx.GraphModule) -> int:
    """Replace every ``t(t(x))`` in ``gm`` by ``x`` (in place; the graph is recompiled and
    transposes left unused are removed). Returns how many were folded.

    One is kept where it is a graph output and ``x`` a graph input: the output must stay a
    view of the input (aot_autograd recorded it as one), not the input itself.
    """
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _T or node.kwargs:
            continue
        inner = node.args[0]
        if not (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target is _T
                and not inner.kwargs and isinstance(inner.args[0], fx.Node)):
            continue
        src = inner.args[0]
        if src.op == "placeholder" and any(u.op == "output" for u in node.users):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        if not inner.users:
            gm.graph.erase_node(inner)
        folded += 1
    if folded:
        gm.recompile()
    return folded

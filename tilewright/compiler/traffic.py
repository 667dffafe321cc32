"""Modelled memory traffic and launch counts of a graph, compiled or run op by op in eager.

The model is the one every fusion decision is scored by: a kernel reads each of its inputs and
writes each of its outputs once (distinct elements: an expanded tensor counts once). Eager runs
each FX op as its own kernel, so its traffic is every op's inputs and outputs; views and
allocations are free in both (they move nothing and launch nothing).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from tilewright.compiler.graph import ExternNode, KernelGraph, TensorMeta
from tilewright.ir import dtypes

FREE_KINDS = ("view", "getitem", "constant")
aten = torch.ops.aten
# uninitialised allocations: no kernel runs (the caching allocator hands out memory), no byte
# moves; a launch count that included them overstated both sides (issue 21: a Qwen3-MoE's
# empty_like counted as launches)
ALLOCATIONS = frozenset({aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                         aten.empty_strided.default, aten.new_empty_strided.default,
                         aten.empty_permuted.default})


def tensor_bytes(meta: TensorMeta | None) -> int:
    """Bytes of a tensor's distinct elements (dims of stride 0 count once) at its traced sizes."""
    if meta is None or meta.dtype not in dtypes.NAMES:
        return 0
    n = 1
    for size, stride in zip(meta.hint_shape, meta.stride):
        if stride != 0:
            n *= size
    return n * dtypes.ITEMSIZE[dtypes.name_of(meta.dtype)]


def _node_bytes(node: fx.Node) -> int:
    metas = [TensorMeta.of(x) for x in node.all_input_nodes]
    val = node.meta.get("val")
    outs = val if isinstance(val, (tuple, list)) else [val]
    total = sum(tensor_bytes(m) for m in metas)
    for v in outs:
        if isinstance(v, torch.Tensor) and v.dtype in dtypes.NAMES:
            total += tensor_bytes(_meta_of(v))
    return total


def _meta_of(v: torch.Tensor) -> TensorMeta:
    from tilewright.compiler.graph import size_hint, to_sympy

    return TensorMeta(tuple(to_sympy(s) for s in v.shape), tuple(to_sympy(s) for s in v.stride()),
                      tuple(size_hint(s) for s in v.shape), v.dtype, v.device)


def is_free(node: fx.Node) -> bool:
    """Views, tuple accesses, constants and allocations (:data:`ALLOCATIONS`), and arithmetic on
    sizes (a dynamic graph's ``sym_size``, ``s0 * s1``: Python on the host): no launch, no
    traffic."""
    from tilewright.compiler.lower import VIEWS

    val = node.meta.get("val")
    host = isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))
    return (node.op != "call_function" or node.target in VIEWS or node.target is operator.getitem
            or node.target in ALLOCATIONS or host)


def eager_cost(gm: fx.GraphModule) -> tuple[int, int]:
    """(launches, bytes) of running ``gm`` op by op."""
    launches = traffic = 0
    for node in gm.graph.nodes:
        if is_free(node):
            continue
        launches += 1
        traffic += _node_bytes(node)
    return launches, traffic


def compiled_cost(kg: KernelGraph, kernel_bytes: dict[str, int]) -> tuple[int, int]:
    """(ATen calls that launch work, bytes) of the compiled graph; ``kernel_bytes`` gives each
    kernel node's modelled traffic (its problem's ``min_bytes``: GEMMs, loop kernels and the
    kernels of every other kind)."""
    externs = traffic = 0
    for n in kg.nodes:
        if n.launches_kernel:
            traffic += kernel_bytes.get(n.name, 0)
        elif isinstance(n, ExternNode) and not is_free(n.fx_node) and n.kind not in FREE_KINDS:
            externs += 1
            traffic += _node_bytes(n.fx_node)
    return externs, traffic

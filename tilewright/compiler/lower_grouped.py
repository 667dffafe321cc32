"""Lowering of ``aten._grouped_mm`` (what ``torch._grouped_mm`` / ``F.grouped_mm`` trace to,
forward and, from aot_autograd, backward: a 2d3d forward's input gradient is another 2d3d call,
its weight gradient a 2d2d ragged-K call) to ``torch.ops.tilewright.grouped_mm``, the custom op
whose kernel the autotuner picks per problem (bucketed on the token count).

The node stays an extern call in the kernel graph (its target replaced, its arguments made
positional), so the wrapper runs it as it runs any op; the offsets tensor is passed through
untouched, on the device. A unary activation that is the call's only user (inference; in
training the product is also saved for the backward) is fused into the op
(:func:`fuse_activations`); other epilogues (SwiGLU products, casts) are reachable through
``tilewright.kernels.grouped`` but not yet fused by the compiler.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from tilewright.compiler.graph import TensorMeta
import tilewright.kernels.grouped  # noqa: F401 - registers torch.ops.tilewright.grouped_mm
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES

aten = torch.ops.aten
ACTIVATIONS = {aten.silu.default: "silu", aten.relu.default: "relu", aten.sigmoid.default: "sigmoid",
               aten.tanh.default: "tanh", aten.gelu.default: "gelu"}

GROUPED_MM = torch.ops.aten._grouped_mm.default
TILEWRIGHT_GROUPED_MM = torch.ops.tilewright.grouped_mm.default
ARG_NAMES = ("self", "mat2", "offs", "bias", "out_dtype")


def why_not_grouped(node: fx.Node) -> str | None:
    """Why this ``_grouped_mm`` node stays on ATen (None when it lowers)."""
    bound = dict(zip(ARG_NAMES, node.args)) | dict(node.kwargs)
    a, b, offs = bound.get("self"), bound.get("mat2"), bound.get("offs")
    ma, mb, mo = TensorMeta.of(a), TensorMeta.of(b), TensorMeta.of(node)
    if None in (ma, mb, mo):
        return "operands without tensor metadata"
    if ma.dtype != mb.dtype or DTYPE_NAMES.get(ma.dtype) not in GEMM_INPUT_DTYPES:
        return f"operand dtypes {ma.dtype}, {mb.dtype} (tilewright lowers fp32/fp16/bf16)"
    if ma.ndim not in (2, 3) or mb.ndim not in (2, 3):
        return "operands that are not 2-D or 3-D"
    if (ma.ndim, mb.ndim) != (3, 3) and (offs is None or TensorMeta.of(offs) is None):
        return "a ragged case without offsets"
    if bound.get("bias") is not None:
        return "a bias (ATen's CPU path has none either; the op's epilogue takes it)"
    return None


def lower_grouped_mm(node: fx.Node) -> bool:
    """Retarget ``node`` to the tuned custom op, in place; False when it stays ATen's."""
    if node.target is not GROUPED_MM or why_not_grouped(node) is not None:
        return False
    bound = dict(zip(ARG_NAMES, node.args)) | dict(node.kwargs)
    node.target = TILEWRIGHT_GROUPED_MM
    node.args = tuple(bound.get(n) for n in ARG_NAMES)
    node.kwargs = {}
    return True


def fuse_activations(gm: fx.GraphModule) -> int:
    """Fold ``act(tilewright.grouped_mm(...))`` into one call with ``activation=act`` when the
    product has no other user, in place; returns the number folded. Runs after
    :func:`lower_grouped_mm` retargeted the calls (``lower`` calls it once per graph)."""
    folded = 0
    for node in list(gm.graph.nodes):
        if node.target is not TILEWRIGHT_GROUPED_MM or len(node.users) != 1 or node.args[5:6] not in ((), ("none",)):
            continue
        user = next(iter(node.users))
        kind = ACTIVATIONS.get(user.target) if user.op == "call_function" else None
        if kind is None or user.args[:1] != (node,) or len(user.args) > 1:
            continue
        if kind == "gelu":
            approximate = user.kwargs.get("approximate", "none")
            if set(user.kwargs) - {"approximate"} or approximate not in ("none", "tanh"):
                continue
            kind = "gelu" if approximate == "none" else "gelu_tanh"
        elif user.kwargs:
            continue
        # the activation's node becomes the fused call (it keeps its name, meta and users)
        user.target = TILEWRIGHT_GROUPED_MM
        user.args = tuple(node.args[:5]) + (kind,)
        user.kwargs = {}
        gm.graph.erase_node(node)
        folded += 1
    if folded:
        gm.recompile()
    return folded

"""Lowering of ``aten._grouped_mm`` (what ``torch._grouped_mm`` / ``F.grouped_mm`` trace to,
forward and, from aot_autograd, backward: a 2d3d forward's input gradient is another 2d3d call,
its weight gradient a 2d2d ragged-K call) to ``torch.ops.tilewright.grouped_mm``, the custom op
whose kernel the autotuner picks per problem (bucketed on the token count).

The retargeted node (its arguments made positional) then becomes a grouped-GEMM kernel node of
the kernel graph (:mod:`tilewright.kinds.grouped_gemm`, which runs these rewrites as its
``rewrite_fx`` hook), chosen, rendered and compiled in the pipeline's stages; the offsets tensor
is passed through untouched, on the device. Epilogues whose intermediates nobody else reads (inference; in
training the product is also saved for the backward, so nothing folds) are fused into the op
by :func:`fuse_epilogues`, in this order:

1. the gated product of the MoE expert MLP, ``gate, up = y.chunk(2, -1); act(gate) * up``
   (HF transformers' ``_default_apply_gate`` after the gate_up grouped_mm; in ATen a
   ``split``/``split_with_sizes``/``chunk`` or two ``slice`` ops on the last dim, then the
   activation and a ``mul`` in either order) becomes ``glu=act``: the kernel computes both
   halves and writes only the product (:mod:`tilewright.kinds.grouped_gemm`);
2. a unary activation of the result;
3. a cast of the result (``_to_copy`` / ``convert_element_type`` to fp32/fp16/bf16) becomes
   ``out_dtype``.

Anything else (another split, an activation on the up half, a bias with the gated product)
stays as it is: unfused ATen ops after the grouped call, correct and slower.
"""

from __future__ import annotations

import torch
import torch.fx as fx

import operator
import sys

from tilewright.compiler.graph import TensorMeta
from tilewright.problem import DTYPE_NAMES, GEMM_INPUT_DTYPES

prims = torch.ops.prims

aten = torch.ops.aten
ACTIVATIONS = {aten.silu.default: "silu", aten.relu.default: "relu", aten.sigmoid.default: "sigmoid",
               aten.tanh.default: "tanh", aten.gelu.default: "gelu"}

GROUPED_MM = torch.ops.aten._grouped_mm.default
OURS = "tilewright::grouped_mm"  # the public op (tilewright.kernels), by name


def tilewright_grouped_mm():
    """The public op this module retargets ``_grouped_mm`` to: registered by
    :mod:`tilewright.kernels.grouped`, the layer above the compiler, imported when first needed."""
    import tilewright.kernels.grouped  # noqa: F401

    return torch.ops.tilewright.grouped_mm.default


def __getattr__(name: str):
    if name == "TILEWRIGHT_GROUPED_MM":  # the op itself, as this module's constant was
        return tilewright_grouped_mm()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_ours(target) -> bool:
    """Whether an FX node's target is the public grouped op (compared by name)."""
    return isinstance(target, torch._ops.OpOverload) and target.name() == OURS
ARG_NAMES = ("self", "mat2", "offs", "bias", "out_dtype")
# the fused op's arguments after aten's: tilewright::grouped_mm(..., activation, glu)
ACTIVATION, GLU = 5, 6
CASTS = (aten._to_copy.default, prims.convert_element_type.default)
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
    node.target = tilewright_grouped_mm()
    node.args = tuple(bound.get(n) for n in ARG_NAMES)
    node.kwargs = {}
    return True


def _arg(node: fx.Node, i: int, default: str = "none"):
    return node.args[i] if len(node.args) > i else default


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _activation(node: fx.Node, x: fx.Node) -> str | None:
    """The unary epilogue kind ``node`` applies to ``x`` alone (None when it is not one)."""
    kind = ACTIVATIONS.get(node.target) if node.op == "call_function" else None
    if kind is None or node.args != (x,):
        return None
    if kind == "gelu":
        approximate = node.kwargs.get("approximate", "none")
        if set(node.kwargs) - {"approximate"} or approximate not in ("none", "tanh"):
            return None
        return "gelu" if approximate == "none" else "gelu_tanh"
    return None if node.kwargs else kind


def _static(size) -> int | None:
    """A size that is a number (an int or sympy Integer), as an int; None when symbolic."""
    try:
        return int(size)
    except TypeError:
        return None


def _last_dim(d, ndim: int) -> bool:
    return isinstance(d, int) and d in (-1, ndim - 1)


def _halves(node: fx.Node, n: int, ndim: int) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """(gate, up, the split nodes) when every user of ``node`` takes one of the two equal
    halves of its last dim (of size ``n``) and each half is read once; None otherwise."""
    h = n // 2
    users = list(node.users)
    if len(users) == 1 and users[0].target in (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default):
        split = users[0]
        args = list(split.args[1:]) + [split.kwargs[k] for k in ("dim",) if k in split.kwargs]
        sizes = args[0] if args else None
        dim = args[1] if len(args) > 1 else 0
        if split.target is aten.split_with_sizes.default:
            equal = isinstance(sizes, (list, tuple)) and list(sizes) == [h, h]
        else:
            equal = sizes == (h if split.target is aten.split.Tensor else 2)
        parts = list(split.users)
        if not (equal and _last_dim(dim, ndim) and len(parts) == 2 and all(p.target is operator.getitem for p in parts)):
            return None
        by_index = {p.args[1]: p for p in parts}
        if set(by_index) != {0, 1}:
            return None
        return by_index[0], by_index[1], [by_index[0], by_index[1], split]
    if len(users) == 2 and all(u.target is aten.slice.Tensor and not u.kwargs for u in users):
        spans = {}
        for u in users:
            dim, start, end, step = (list(u.args[1:]) + [0, None, sys.maxsize, 1][len(u.args) - 1:])[:4]
            if not _last_dim(dim, ndim) or step != 1:
                return None
            spans[(start or 0, min(end if end is not None else sys.maxsize, n))] = u
        if set(spans) != {(0, h), (h, n)}:
            return None
        return spans[(0, h)], spans[(h, n)], [spans[(0, h)], spans[(h, n)]]
    return None


def fuse_glu(gm: fx.GraphModule) -> int:
    """Fold ``act(y[..., :N/2]) * y[..., N/2:]`` of ``y = tilewright.grouped_mm(...)`` into one
    call with ``glu=act`` (module docstring), in place, when nothing else reads ``y``, its halves
    or the activation; returns the number folded. The ``mul`` node becomes the call, so it keeps
    its name, meta (the (…, N/2) result) and users."""
    folded = 0
    for node in list(gm.graph.nodes):
        if not is_ours(node.target) or _arg(node, ACTIVATION) != "none" or _arg(node, GLU) != "none":
            continue
        meta, ma, mb = TensorMeta.of(node), TensorMeta.of(node.args[0]), TensorMeta.of(node.args[1])
        # not with a bias (before or after the product?), nor for 3d2d, whose N is ragged
        if node.args[3] is not None or None in (meta, ma, mb) or (ma.ndim, mb.ndim) == (3, 2):
            continue
        n = _static(meta.shape[-1])
        if n is None or n % 2 or (found := _halves(node, n, meta.ndim)) is None:
            continue
        gate, up, splits = found
        act, mul = _only_user(gate), _only_user(up)
        kind = _activation(act, gate) if act is not None else None
        if kind is None or mul is None or mul.target is not aten.mul.Tensor or _only_user(act) is not mul \
                or set(mul.args) != {act, up} or len(mul.args) != 2 or mul.kwargs:
            continue
        mul.target = tilewright_grouped_mm()
        mul.args = tuple(node.args[:5]) + ("none", kind)
        mul.kwargs = {}
        for dead in [act] + splits + [node]:
            gm.graph.erase_node(dead)
        folded += 1
    return folded


def fuse_activations(gm: fx.GraphModule) -> int:
    """Fold ``act(tilewright.grouped_mm(...))`` into one call with ``activation=act`` when the
    result has no other user, in place; returns the number folded. After a fused gated product
    the activation applies to that product (the op's epilogue runs on it)."""
    folded = 0
    for node in list(gm.graph.nodes):
        if not is_ours(node.target) or _arg(node, ACTIVATION) != "none":
            continue
        user = _only_user(node)
        kind = _activation(user, node) if user is not None else None
        if kind is None:
            continue
        # the activation's node becomes the fused call (it keeps its name, meta and users)
        user.target = tilewright_grouped_mm()
        user.args = tuple(node.args[:5]) + (kind, _arg(node, GLU))
        user.kwargs = {}
        gm.graph.erase_node(node)
        folded += 1
    return folded


def fuse_casts(gm: fx.GraphModule) -> int:
    """Fold a cast of a ``tilewright.grouped_mm`` result (its only user: ``_to_copy`` with
    nothing but a dtype, or ``prims.convert_element_type``) into the call's ``out_dtype``, in
    place; returns the number folded. The fp32 accumulator is then rounded once, to the cast's
    dtype, instead of to the operands' dtype first."""
    folded = 0
    for node in list(gm.graph.nodes):
        if not is_ours(node.target) or (user := _only_user(node)) is None or user.target not in CASTS:
            continue
        if user.target is aten._to_copy.default:
            mo, mn = TensorMeta.of(user), TensorMeta.of(node)
            extra = set(user.kwargs) - {"dtype", "layout", "device"}
            same_place = user.kwargs.get("layout", torch.strided) == torch.strided and (
                "device" not in user.kwargs or (mo is not None and mn is not None and mo.device == mn.device))
            dtype = user.kwargs.get("dtype")
            if user.args != (node,) or extra or not same_place:
                continue
        else:
            if len(user.args) != 2 or user.args[0] is not node or user.kwargs:
                continue
            dtype = user.args[1]
        if dtype not in OUT_DTYPES:
            continue
        user.target = tilewright_grouped_mm()
        args = list(node.args) + ["none"] * (GLU + 1 - len(node.args))
        args[4] = dtype
        user.args = tuple(args)
        user.kwargs = {}
        gm.graph.erase_node(node)
        folded += 1
    return folded


def fuse_epilogues(gm: fx.GraphModule) -> int:
    """Fold gated products, then activations, then casts into the ``tilewright.grouped_mm``
    calls :func:`lower_grouped_mm` made, in place (module docstring); returns the number of
    nodes folded. The grouped-GEMM kind calls it once per graph, before lowering."""
    folded = fuse_glu(gm) + fuse_activations(gm) + fuse_casts(gm)
    if folded:
        gm.recompile()
    return folded

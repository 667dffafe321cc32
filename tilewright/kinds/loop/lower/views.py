"""Lowering rules for views: each is an index map onto its source (no copy, no node)."""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import TensorMeta, to_sympy
from tilewright.kinds.loop.lower import Scalar, Unsupported, View, is_one, lowering
from tilewright.ir.index import expand_index, permute_index, reshape_index

aten = torch.ops.aten


def _source(ctx, x: fx.Node):
    v = ctx.value(x)
    if isinstance(v, Scalar):
        raise Unsupported("view of a scalar")
    return v


def _out_shape(node: fx.Node) -> tuple[sympy.Expr, ...]:
    meta = TensorMeta.of(node)
    if meta is None:
        raise Unsupported("no metadata")
    return meta.shape


def _sym(x) -> sympy.Expr:
    if isinstance(x, fx.Node):
        val = x.meta.get("val")
        if isinstance(val, torch.SymInt):
            return to_sympy(val)
        raise Unsupported("a tensor where a size is expected")
    return sympy.Integer(int(x))


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view.dtype)
def _view(ctx, node, a):
    if node.target == aten.view.dtype:
        raise Unsupported("dtype view (a bitcast)")
    src = _source(ctx, a["self"])
    new = _out_shape(node)
    old = src.shape
    if any(d == 0 for d in tuple(old) + tuple(new)):
        raise Unsupported("a view of an empty tensor (its index map would divide by zero)")
    try:
        reshape_index(old, new, tuple(sympy.Symbol(f"_{i}") for i in range(len(new))))
    except ValueError as e:
        raise Unsupported(str(e)) from e
    return View(src, new, lambda idx: reshape_index(old, new, idx))


@lowering(aten.permute.default)
def _permute(ctx, node, a):
    src = _source(ctx, a["self"])
    dims = [d % max(src.ndim, 1) for d in a["dims"]]
    return View(src, _out_shape(node), lambda idx: permute_index(dims, idx))


@lowering(aten.transpose.int)
def _transpose(ctx, node, a):
    src = _source(ctx, a["self"])
    n = max(src.ndim, 1)
    d0, d1 = a["dim0"] % n, a["dim1"] % n
    dims = list(range(src.ndim))
    if src.ndim:
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return View(src, _out_shape(node), lambda idx: permute_index(dims, idx))


@lowering(aten.t.default)
def _t(ctx, node, a):
    src = _source(ctx, a["self"])
    dims = [1, 0] if src.ndim == 2 else list(range(src.ndim))
    return View(src, _out_shape(node), lambda idx: permute_index(dims, idx))


@lowering(aten.expand.default)
def _expand(ctx, node, a):
    src = _source(ctx, a["self"])
    shape = src.shape
    return View(src, _out_shape(node), lambda idx: expand_index(shape, idx))


@lowering(aten.unsqueeze.default)
def _unsqueeze(ctx, node, a):
    src = _source(ctx, a["self"])
    d = a["dim"] % (src.ndim + 1)
    return View(src, _out_shape(node), lambda idx: idx[:d] + idx[d + 1:])


@lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx, node, a):
    src = _source(ctx, a["self"])
    if node.target == aten.squeeze.default:
        dims = [d for d, s in enumerate(src.shape) if s == 1]
    else:
        raw = a["dim"] if isinstance(a["dim"], (list, tuple)) else [a["dim"]]
        dims = [d % max(src.ndim, 1) for d in raw if src.ndim and src.shape[d % src.ndim] == 1]
    return _squeezed(src, node, set(dims))


def _squeezed(src, node, dims: set[int]) -> View:
    """``src`` without its size-1 ``dims``: they are read at 0."""
    def fn(idx):
        out, k = [], 0
        for d in range(src.ndim):
            if d in dims:
                out.append(sympy.Integer(0))
            else:
                out.append(idx[k])
                k += 1
        return tuple(out)
    return View(src, _out_shape(node), fn)


def _slice_view(src, out_shape, dim: int, start: sympy.Expr, step: int) -> View:
    def fn(idx):
        return idx[:dim] + (start + idx[dim] * step,) + idx[dim + 1:]
    return View(src, out_shape, fn)


def _normalise_start(start, size: sympy.Expr) -> sympy.Expr:
    if start is None:
        return sympy.Integer(0)
    s = _sym(start)
    if s.is_number and s < 0:
        s = s + size
        if s.is_number and s < 0:
            s = sympy.Integer(0)
    if s.is_number and size.is_number and s > size:
        s = size
    return s


@lowering(aten.slice.Tensor)
def _slice(ctx, node, a):
    src = _source(ctx, a["self"])
    dim = a["dim"] % src.ndim
    step = a["step"]
    if isinstance(step, fx.Node) or step < 1:
        raise Unsupported("symbolic or non-positive slice step")
    start = _normalise_start(a["start"], src.shape[dim])
    return _slice_view(src, _out_shape(node), dim, start, int(step))


@lowering(aten.select.int)
def _select(ctx, node, a):
    src = _source(ctx, a["self"])
    dim = a["dim"] % src.ndim
    i = _sym(a["index"])
    if i.is_number and i < 0:
        i = i + src.shape[dim]

    def fn(idx):
        return idx[:dim] + (i,) + idx[dim:]
    return View(src, _out_shape(node), fn)


@lowering(aten.split.Tensor, aten.split_with_sizes.default)
def _split(ctx, node, a):
    src = _source(ctx, a["self"])
    dim = a["dim"] % src.ndim
    vals = node.meta["val"]
    out, start = [], sympy.Integer(0)
    for v in vals:
        shape = tuple(to_sympy(s) for s in v.shape)
        out.append(_slice_view(src, shape, dim, start, 1))
        start = start + shape[dim]
    return tuple(out)


@lowering(aten.unbind.int)
def _unbind(ctx, node, a):
    src = _source(ctx, a["self"])
    dim = a["dim"] % src.ndim
    out = []
    for k, v in enumerate(node.meta["val"]):
        shape = tuple(to_sympy(s) for s in v.shape)
        out.append(View(src, shape, lambda idx, k=k: idx[:dim] + (sympy.Integer(k),) + idx[dim:]))
    return tuple(out)


prims = torch.ops.prims


@lowering(prims.broadcast_in_dim.default)
def _broadcast_in_dim(ctx, node, a):
    src = _source(ctx, a["a"])
    dims = list(a["broadcast_dimensions"])
    shape = src.shape

    def fn(idx):
        return tuple(sympy.Integer(0) if is_one(shape[k]) else idx[d] for k, d in enumerate(dims))
    return View(src, _out_shape(node), fn)


@lowering(prims.squeeze.default)
def _prims_squeeze(ctx, node, a):
    src = _source(ctx, a["a"])
    return _squeezed(src, node, {d % max(src.ndim, 1) for d in a["dimensions"]})


@lowering(prims.view_of.default)
def _view_of(ctx, node, a):
    src = _source(ctx, a["a"])
    return View(src, src.shape, lambda idx: idx)

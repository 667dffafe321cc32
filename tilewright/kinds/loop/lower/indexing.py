"""Lowering rules for ops that move data by index: concatenation, padding, the backward of
slicing and selecting, and gathers (embedding, advanced indexing, ``gather``, ``index_select``).
Out-of-range parts are masked loads: nothing is read where the mask is false. Indexing that
writes (scatter, index_put, ...) is in :mod:`~tilewright.kinds.loop.lower.scatters`."""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import TensorMeta
from tilewright.kinds.loop.lower import Scalar, Unsupported, is_one, lowering
from tilewright.kinds.loop.lower.views import _normalise_start, _sym
from tilewright.ir import dtypes
from tilewright.ir import expr as E

aten = torch.ops.aten


def _idx(i: sympy.Expr) -> E.Node:
    return E.index(i)


def _in_range(i: sympy.Expr, lo: sympy.Expr, hi: sympy.Expr) -> E.Node:
    """lo <= i < hi, as a boolean node."""
    v = _idx(i)
    return E.op("logical_and", E.op("ge", v, E.index(lo)), E.op("lt", v, E.index(hi)))


def _all(conds: list[E.Node]) -> E.Node | None:
    out = None
    for c in conds:
        out = c if out is None else E.op("logical_and", out, c)
    return out


def _tensor(ctx, x):
    v = ctx.value(x)
    if isinstance(v, Scalar):
        raise Unsupported("scalar operand")
    return v


@lowering(aten.cat.default)
def _cat(ctx, node, a):
    out_meta = TensorMeta.of(node)
    out = dtypes.name_of(out_meta.dtype)
    cdt = dtypes.compute_type(out)
    parts = [_tensor(ctx, t) for t in a["tensors"]]
    dim = a["dim"] % out_meta.ndim
    # legacy empty 1-D inputs take no part; others are placed one after the other along dim
    parts = [p for p in parts if not (p.ndim == 1 and p.shape[0] == 0 and out_meta.ndim > 1)]
    spans, start = [], sympy.Integer(0)
    for p in parts:
        spans.append((p, start, start + p.shape[dim]))
        start = start + p.shape[dim]

    def body(idx):
        value = None
        for p, lo, hi in reversed(spans):
            inside = _in_range(idx[dim], lo, hi)
            src = idx[:dim] + (idx[dim] - lo,) + idx[dim + 1:]
            v = E.cast(p.load(src, mask=inside), cdt)
            value = v if value is None else E.where(inside, v, value)
        return value if value is not None else E.const(0, cdt)
    return ctx.loop(node, body)


@lowering(aten.stack.default)
def _stack(ctx, node, a):
    out_meta = TensorMeta.of(node)
    dim = a["dim"] % out_meta.ndim
    parts = [_tensor(ctx, t) for t in a["tensors"]]
    cdt = dtypes.compute_type(dtypes.name_of(out_meta.dtype))

    def body(idx):
        value = None
        for k, p in reversed(list(enumerate(parts))):
            here = E.op("eq", _idx(idx[dim]), E.index(k))
            v = E.cast(p.load(idx[:dim] + idx[dim + 1:], mask=here), cdt)
            value = v if value is None else E.where(here, v, value)
        return value
    return ctx.loop(node, body)


@lowering(aten.constant_pad_nd.default)
def _pad(ctx, node, a):
    x = _tensor(ctx, a["self"])
    pad = [_sym(p) for p in a["pad"]]
    value = a["value"]
    out = dtypes.name_of(TensorMeta.of(node).dtype)
    cdt = dtypes.compute_type(out)

    def body(idx):
        src, conds = list(idx), []
        for k in range(len(pad) // 2):
            d = x.ndim - 1 - k
            before = pad[2 * k]
            src[d] = idx[d] - before
            conds.append(_in_range(src[d], 0, x.shape[d]))
        inside = _all(conds)
        v = E.cast(x.load(tuple(src), mask=inside), cdt)
        return v if inside is None else E.where(inside, v, E.const(value, cdt))
    return ctx.loop(node, body)


@lowering(aten.slice_backward.default)
def _slice_backward(ctx, node, a):
    g = _tensor(ctx, a["grad_output"])
    sizes = [_sym(s) for s in a["input_sizes"]]
    dim = a["dim"] % len(sizes)
    step = a["step"]
    if isinstance(step, fx.Node) or step < 1:
        raise Unsupported("slice step")
    start = _normalise_start(a["start"], sizes[dim])
    cdt = dtypes.compute_type(g.dtype)

    def body(idx):
        rel = idx[dim] - start
        inside = _in_range(rel, 0, g.shape[dim] * step)
        if step > 1:
            inside = E.op("logical_and", inside, E.op("eq", E.index(sympy.Mod(idx[dim] + step * g.shape[dim] - start, step)),
                                                      E.index(0)))
        src = idx[:dim] + (sympy.floor(rel / step) if step > 1 else rel,) + idx[dim + 1:]
        return E.where(inside, E.cast(g.load(src, mask=inside), cdt), E.const(0, cdt))
    return ctx.loop(node, body)


@lowering(aten.select_backward.default)
def _select_backward(ctx, node, a):
    g = _tensor(ctx, a["grad_output"])
    sizes = [_sym(s) for s in a["input_sizes"]]
    dim = a["dim"] % len(sizes)
    index = _sym(a["index"])
    if index.is_number and index < 0:
        index = index + sizes[dim]
    cdt = dtypes.compute_type(g.dtype)

    def body(idx):
        here = E.op("eq", _idx(idx[dim]), E.index(index))
        return E.where(here, E.cast(g.load(idx[:dim] + idx[dim + 1:], mask=here), cdt), E.const(0, cdt))
    return ctx.loop(node, body)


def _wrapped(ind: E.Node, size: sympy.Expr) -> E.Node:
    """A gathered index with negative values counted from the end: only where eager counts
    them so (advanced indexing ``x[i]``, ``index_put``); ``embedding``, ``gather`` and
    ``index_select`` raise for them, so they take :func:`_plain`. What is still outside the dim
    after wrapping is the kernel's bounds check's to report (:mod:`tilewright.ir.bounds`)."""
    ind = E.cast(ind, "i64")
    return E.where(E.op("lt", ind, E.const(0, "i64")), ind + E.cast(E.index(size), "i64"), ind)


def _plain(ind: E.Node, size: sympy.Expr) -> E.Node:
    """A gathered index as it is: -1 is out of range (the kernel's bounds check raises)."""
    return E.cast(ind, "i64")


def _bounded(ind: E.Node, size: sympy.Expr) -> E.Node:
    """A gathered index checked against ``size``, the extent of the dim it indexes in the
    tensor the user indexed: a view's (``w[:3][i]``, an expanded 0-d table), which the
    buffer's dim behind it may exceed, so the buffer's own check would let ``i = 5`` read
    ``w[5]`` (:func:`tilewright.ir.expr.checked`)."""
    return E.checked(ind, size)


def _gathered(ctx, x):
    """Gathers read through an index that is data: a buffer in memory, or a view of one (its
    index map applies to the gathered index; a view of a computed value makes the scheduler
    keep that value in memory, as a gather reads only memory)."""
    return x


@lowering(aten.embedding.default)
def _embedding(ctx, node, a):
    w = _gathered(ctx, _tensor(ctx, a["weight"]))
    ids = _tensor(ctx, a["indices"])
    if w.ndim != 2:
        raise Unsupported("embedding weight of rank != 2")

    def body(idx):
        ind = _bounded(_plain(ids.load(idx[:-1]), w.shape[0]), w.shape[0])
        return w.load((E.indirect_symbol(0), idx[-1]), indirect=(ind,))
    return ctx.loop(node, body)


def _gather_along(ctx, node, a, index_at):
    """``self`` read at ``index[index_at(out index)]`` along ``dim`` (index_select, gather)."""
    x = _gathered(ctx, _tensor(ctx, a["self"]))
    index = _tensor(ctx, a["index"])
    dim = a["dim"] % max(x.ndim, 1)
    size = x.shape[dim] if x.ndim else sympy.Integer(1)  # a 0-d self is one element along dim 0

    def body(idx):
        ind = _bounded(_plain(index.load(index_at(idx, dim, index)), size), size)
        src = idx[:dim] + (E.indirect_symbol(0),) + idx[dim + 1:]
        return x.load(src, indirect=(ind,))
    return ctx.loop(node, body)


@lowering(aten.index_select.default)
def _index_select(ctx, node, a):
    return _gather_along(ctx, node, a, lambda idx, dim, index: (idx[dim],) if index.ndim else ())


@lowering(aten.gather.default)
def _gather_rule(ctx, node, a):
    return _gather_along(ctx, node, a, lambda idx, dim, index: idx)


@lowering(aten.index.Tensor)
def _index(ctx, node, a):
    x = _gathered(ctx, _tensor(ctx, a["self"]))
    indices = list(a["indices"])
    used = [k for k, t in enumerate(indices) if t is not None]
    if not used:
        raise Unsupported("index without index tensors")
    # adjacent index tensors put their broadcast dims where they are; apart, first (numpy's rule)
    adjacent = used == list(range(used[0], used[-1] + 1))
    idx_vals = []
    for k in used:
        v = _tensor(ctx, indices[k])
        if v.dtype not in ("i64", "i32"):
            raise Unsupported("boolean mask indexing (data-dependent shape)")
        idx_vals.append(v)
    out_meta = TensorMeta.of(node)
    nb = out_meta.ndim - (x.ndim - len(used))  # dims of the broadcast index shape
    first = used[0] if adjacent else 0

    def body(idx):
        bidx = idx[first:first + nb]
        ind = []
        for k, v in zip(used, idx_vals):
            lead = nb - v.ndim
            vi = tuple(sympy.Integer(0) if is_one(s) else bidx[lead + d] for d, s in enumerate(v.shape))
            ind.append(_bounded(_wrapped(v.load(vi), x.shape[k]), x.shape[k]))
        others = iter(idx[:first] + idx[first + nb:])
        src = [E.indirect_symbol(used.index(d)) if d in used else next(others) for d in range(x.ndim)]
        return x.load(tuple(src), indirect=tuple(ind))
    return ctx.loop(node, body)

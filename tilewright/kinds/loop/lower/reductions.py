"""Lowering rules for reductions: sums, means, extremes and their positions, products,
variance (Welford), norms, any/all. Softmax, log-softmax and the norms' native forms are
decomposed by aot_autograd (``compiler/decompositions.py``) into these plus pointwise ops; the
scheduler puts each back together as one kernel."""

from __future__ import annotations

from typing import Sequence

import sympy
import torch
import torch.fx as fx

from tilewright.kinds.loop.lower import LoopLowering, Scalar, Unsupported, lowering
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import product

aten = torch.ops.aten


def _dims(a_dim, ndim: int) -> list[int]:
    """The reduced dims, normalised; a 0-d tensor has none (torch accepts dim 0 or -1 there and
    reduces its one element: ``LoopLowering.reduction`` makes that a one-element row)."""
    if ndim == 0 or a_dim is None or (isinstance(a_dim, (list, tuple)) and len(a_dim) == 0):
        return list(range(ndim))
    raw = a_dim if isinstance(a_dim, (list, tuple)) else [a_dim]
    return sorted({d % ndim for d in raw})


def _acc_dtype(src: str, out: str) -> str:
    """What a sum accumulates in: fp32 for narrow floats, int64 for integers and bools."""
    if dtypes.is_float(out):
        return dtypes.compute_type(out)
    return "i64" if src != "bool" or out != "bool" else "bool"


def _reduce(ctx: LoopLowering, node: fx.Node, x, dims: Sequence[int], keepdim: bool, kind: str,
            post=None, name: str | None = None, meta=None, acc: str | None = None):
    if isinstance(x, Scalar):
        raise Unsupported("reduction of a scalar")
    out_dtype = dtypes.name_of(meta.dtype if meta is not None else node.meta["val"].dtype)
    acc = acc or (_acc_dtype(x.dtype, out_dtype) if kind not in ("argmax", "argmin", "max", "min", "any", "all")
                  else dtypes.compute_type(x.dtype))
    n = product([x.shape[d] for d in dims])

    def body(src_index):
        v = E.cast(x.load(src_index), acc if kind not in ("any", "all") else "bool")
        r = E.reduce(kind, v)
        return post(r, n) if post else r
    return ctx.reduction(node, x.shape, dims, keepdim, body, name=name, meta=meta)


def _count(n: sympy.Expr, dtype: str) -> E.Node:
    return E.cast(E.index(n), dtype)


@lowering(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx, node, a):
    x = ctx.value(a["self"])
    return _reduce(ctx, node, x, _dims(a.get("dim"), x.ndim), a.get("keepdim", False), "sum")


@lowering(aten.mean.dim, aten.mean.default)
def _mean(ctx, node, a):
    x = ctx.value(a["self"])
    return _reduce(ctx, node, x, _dims(a.get("dim"), x.ndim), a.get("keepdim", False), "sum",
                   post=lambda r, n: r / _count(n, r.dtype))


@lowering(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, node, a):
    x = ctx.value(a["self"])
    return _reduce(ctx, node, x, _dims(a.get("dim"), x.ndim), a.get("keepdim", False), "prod")


@lowering(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _amax(ctx, node, a):
    x = ctx.value(a["self"])
    kind = "max" if node.target in (aten.amax.default, aten.max.default) else "min"
    return _reduce(ctx, node, x, _dims(a.get("dim"), x.ndim), a.get("keepdim", False), kind)


@lowering(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, node, a):
    x = ctx.value(a["self"])
    kind = "argmax" if node.target == aten.argmax.default else "argmin"
    if x.dtype == "bool":
        # eager refuses ("argmin(): does not support bool input"): ATen raises it (fuzzer find:
        # the kernel returned an index)
        raise Unsupported(f"{kind} of a bool tensor, which eager refuses")
    return _reduce(ctx, node, x, _dims(a["dim"], x.ndim), a["keepdim"], kind)


@lowering(aten.max.dim, aten.min.dim)
def _max_dim(ctx, node, a):
    x = ctx.value(a["self"])
    dims = _dims(a["dim"], x.ndim)
    kind = "max" if node.target == aten.max.dim else "min"
    names = ctx.output_names(node, 2)
    vals = node.meta["val"]
    out = [None, None]
    for k, (reduce_kind, val) in enumerate(((kind, vals[0]), ("arg" + kind, vals[1]))):
        if k in ctx.used_outputs(node):
            out[k] = _reduce(ctx, node, x, dims, a["keepdim"], reduce_kind, name=names[k], meta=_meta(val))
    return tuple(out)


def _meta(val: torch.Tensor):
    from tilewright.compiler.graph import TensorMeta, size_hint, to_sympy

    return TensorMeta(tuple(to_sympy(s) for s in val.shape), tuple(to_sympy(s) for s in val.stride()),
                      tuple(size_hint(s) for s in val.shape), val.dtype, val.device)


@lowering(aten.var_mean.correction, aten.var.correction, aten.std.correction)
def _var_mean(ctx, node, a):
    x = ctx.value(a["self"])
    if isinstance(x, Scalar) or not dtypes.is_float(x.dtype):
        raise Unsupported("variance of integers")
    dims = _dims(a.get("dim"), x.ndim)
    correction = a.get("correction")
    correction = 1 if correction is None else correction
    if isinstance(correction, fx.Node):
        raise Unsupported("symbolic correction")
    keep = a.get("keepdim", False)
    vals = node.meta["val"]
    var_val = vals[0] if isinstance(vals, (tuple, list)) else vals

    def var_post(r, n):
        v = r / E.op("maximum", _count(n, r.dtype) - E.const(correction, r.dtype), E.const(0, r.dtype))
        return E.op("sqrt", v) if node.target == aten.std.correction else v
    if node.target != aten.var_mean.correction:
        return _reduce(ctx, node, x, dims, keep, "welford_m2", post=var_post, acc=dtypes.compute_type(x.dtype))
    names = ctx.output_names(node, 2)
    used = ctx.used_outputs(node)
    out = [None, None]
    if 0 in used:
        out[0] = _reduce(ctx, node, x, dims, keep, "welford_m2", post=var_post, name=names[0],
                         meta=_meta(var_val), acc=dtypes.compute_type(x.dtype))
    if 1 in used:
        out[1] = _reduce(ctx, node, x, dims, keep, "welford_mean", name=names[1], meta=_meta(vals[1]),
                         acc=dtypes.compute_type(x.dtype))
    return tuple(out)


@lowering(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default)
def _any(ctx, node, a):
    x = ctx.value(a["self"])
    kind = "any" if "any" in str(node.target) else "all"
    return _reduce(ctx, node, x, _dims(a.get("dim"), x.ndim), a.get("keepdim", False), kind)


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(ctx, node, a):
    x = ctx.value(a["self"])
    ord_ = a["ord"]
    if isinstance(x, Scalar) or isinstance(ord_, fx.Node) or a.get("dtype") is not None:
        raise Unsupported("norm arguments")
    dims = _dims(a.get("dim"), x.ndim)
    keep = a.get("keepdim", False)
    cdt = dtypes.compute_type(x.dtype)

    def load_abs(src_index):
        return E.op("abs", E.cast(x.load(src_index), cdt))
    if ord_ == float("inf"):
        return ctx.reduction(node, x.shape, dims, keep, lambda i: E.reduce("max", load_abs(i)))
    if ord_ == float("-inf"):
        return ctx.reduction(node, x.shape, dims, keep, lambda i: E.reduce("min", load_abs(i)))
    if ord_ == 2:
        return ctx.reduction(node, x.shape, dims, keep,
                             lambda i: E.op("sqrt", E.reduce("sum", load_abs(i) * load_abs(i))))
    if ord_ == 1:
        return ctx.reduction(node, x.shape, dims, keep, lambda i: E.reduce("sum", load_abs(i)))
    if ord_ == 0:
        return ctx.reduction(node, x.shape, dims, keep, lambda i: E.reduce(
            "sum", E.cast(E.op("ne", load_abs(i), E.const(0, cdt)), cdt)))
    p = float(ord_)
    return ctx.reduction(node, x.shape, dims, keep, lambda i: E.op("pow", E.reduce(
        "sum", E.op("pow", load_abs(i), E.const(p, cdt))), E.const(1 / p, cdt)))


# -- prims (what some decompositions leave behind) -----------------------------------------------
prims = torch.ops.prims


@lowering(prims.sum.default, prims.amax.default, prims.amin.default, prims.prod.default)
def _prims_reduce(ctx, node, a):
    x = ctx.value(a["inp"])
    kind = {"sum": "sum", "amax": "max", "amin": "min", "prod": "prod"}[node.target._opname]
    return _reduce(ctx, node, x, _dims(a["dims"], x.ndim), False, kind)


@lowering(prims.var.default)
def _prims_var(ctx, node, a):
    x = ctx.value(a["inp"])
    if isinstance(x, Scalar) or not dtypes.is_float(x.dtype):
        raise Unsupported("variance of integers")
    correction = a["correction"]
    if isinstance(correction, fx.Node):
        raise Unsupported("symbolic correction")

    def post(r, n):
        return r / E.op("maximum", _count(n, r.dtype) - E.const(correction, r.dtype), E.const(0, r.dtype))
    return _reduce(ctx, node, x, _dims(a["dims"], x.ndim), False, "welford_m2", post=post,
                   acc=dtypes.compute_type(x.dtype))

"""Lowering rules for scans: cumsum, cumprod, logcumsumexp, cummax and cummin along any dim
(the IR's ``scan`` node, :data:`tilewright.ir.ops.SCANS`), and flip, which their backward
formulas use, as an index map.

A scan is a row op like a reduction (its row is the scanned dim, the scheduler places it by its
rows), but its value is one per element, so what precedes and what follows it fuse into its
kernel. Sums and products accumulate in the output's compute type (fp32 for bf16/fp16, as
eager's kernels; int64 for integers and bools, torch's promotion); the result is rounded once,
where stored.
"""

from __future__ import annotations

import torch

from tilewright.compiler.graph import TensorMeta
from tilewright.kinds.loop.lower import Scalar, Unsupported, View, lowering
from tilewright.kinds.loop.lower.reductions import _meta
from tilewright.ir import dtypes
from tilewright.ir import expr as E

aten = torch.ops.aten


def _row(ctx, a):
    x = ctx.value(a["self"])
    if isinstance(x, Scalar):
        raise Unsupported("scan of a scalar")
    if x.ndim == 0:
        raise Unsupported("scan of a 0-d tensor (its one element; ATen copies it)")
    return x, a["dim"] % x.ndim


def _scan(ctx, node, x, dim, kind, meta=None, name=None, compute=None, convert=False):
    """``convert``: the operand is converted to the output dtype first (cumsum/cumprod with a
    ``dtype``: eager converts, then scans; bf16 -3.4e38 is -inf in fp16, and -inf * 0 is NaN
    where the product kept in fp32 gave -0.0: fuzzer find)."""
    meta = meta or TensorMeta.of(node)
    out = dtypes.name_of(meta.dtype)
    cdt = compute or dtypes.compute_type(out)

    def operand(src):
        v = x.load(src)
        return E.cast(E.cast(v, out) if convert and x.dtype != out else v, cdt)
    return ctx.scan(node, x.shape, dim, lambda src: E.scan(kind, operand(src)), meta=meta, name=name)


@lowering(aten.cumsum.default, aten.cumprod.default)
def _cumsum(ctx, node, a):
    x, dim = _row(ctx, a)
    return _scan(ctx, node, x, dim, "sum" if node.target == aten.cumsum.default else "prod", convert=True)


@lowering(aten.logcumsumexp.default)
def _logcumsumexp(ctx, node, a):
    x, dim = _row(ctx, a)
    if not dtypes.is_float(x.dtype):
        raise Unsupported("logcumsumexp of integers")
    return _scan(ctx, node, x, dim, "logsumexp")


@lowering(aten.cummax.default, aten.cummin.default)
def _cummax(ctx, node, a):
    x, dim = _row(ctx, a)
    kind = "max" if node.target == aten.cummax.default else "min"
    names = ctx.output_names(node, 2)
    vals = node.meta["val"]
    used = ctx.used_outputs(node)
    out = [None, None]
    cdt = dtypes.compute_type(x.dtype)  # compared as they are: no promotion
    for k, scan_kind in enumerate((kind, "arg" + kind)):
        if k in used:
            out[k] = _scan(ctx, node, x, dim, scan_kind, meta=_meta(vals[k]), name=names[k], compute=cdt)
    return tuple(out)


@lowering(aten.flip.default)
def _flip(ctx, node, a):
    """``x.flip(dims)``: an index map (each flipped dim read from its end)."""
    x = ctx.value(a["self"])
    if isinstance(x, Scalar):
        raise Unsupported("flip of a scalar")
    dims = {d % max(x.ndim, 1) for d in a["dims"]}
    shape = x.shape
    return View(x, shape, lambda idx: tuple(shape[d] - 1 - i if d in dims else i for d, i in enumerate(idx)))

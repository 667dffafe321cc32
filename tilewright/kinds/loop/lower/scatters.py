"""Lowering rules for indexing that writes: ``index_put`` (with ``accumulate``), ``scatter``,
``scatter_add``, ``scatter_reduce`` (sum, amax, amin, mean; ``include_self`` either way),
``index_add``, the embedding's backward and ``histc``, as scatter loop nodes
(:class:`~tilewright.compiler.graph.Scatter`).

Each op becomes a *target* node (a copy of ``self``, or zeros where ``self`` is a fresh
allocation: what the result starts as, kept in memory by the scheduler) and a scatter node that
writes its values into it, in a later kernel (no grid-wide barrier: the target must be complete
before the writes start). The scatter node fuses with what computes its values and indices; its
target's copy fuses with what computes ``self``, or rides along another kernel.

Duplicates: accumulating ops combine every value (atomics: ``add``, ``max``, ``min``); a plain
write with duplicate indices leaves one of the values, which torch also leaves undefined.
Integer atomics and max/min are deterministic; float sums by atomics are not (their order
varies), so under ``torch.use_deterministic_algorithms(True)`` a float accumulation stays ATen.
Products (``prod``, ``multiply``) have no atomic and stay ATen. Negative indices count from the
end in ``index_put`` (Python's rule, as eager; the other ops refuse them, as eager); an index out
of range is never written: the kernel checks it and raises as eager does (a device assert on a
GPU; :mod:`tilewright.ir.bounds`, ``config.index_checks``).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import LoopNode, Scatter, TensorMeta
from tilewright.kinds.loop.lower import Buffer, Scalar, Unsupported, broadcast_index, lowering
from tilewright.kinds.loop.lower.indexing import _wrapped
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import variables

aten = torch.ops.aten

# ops whose result's contents are undefined: a scatter into one starts from zeros instead of
# copying garbage (index_put(empty_like(x), ...), the inverse permutation of an MoE sort)
_FRESH = {aten.empty_like.default, aten.empty.memory_format, aten.new_empty.default,
          aten.empty_strided.default, aten.new_empty_strided.default}


def _tensor(ctx, x):
    v = ctx.value(x)
    if isinstance(v, Scalar):
        raise Unsupported("scalar operand")
    return v


def _check_deterministic(dtype: str, accumulate: str | None) -> None:
    if accumulate == "add" and dtypes.is_float(dtype) and torch.are_deterministic_algorithms_enabled():
        raise Unsupported("deterministic algorithms: float atomics would sum in any order (ATen's kernel does not)")


def _identity(kind: str, dtype: str) -> float | int | bool:
    if kind == "add":
        return 0.0
    return dtypes.extreme(dtype, lowest=kind == "max")


def target(ctx, node: fx.Node, self_arg, name: str, fill=None) -> str:
    """A loop node holding what the scatter starts as: ``self``'s values (``fill`` where given,
    zeros where ``self`` is a fresh allocation), kept in memory."""
    meta = TensorMeta.of(node)
    out = dtypes.name_of(meta.dtype)
    cdt = dtypes.compute_type(out)
    fresh = isinstance(self_arg, fx.Node) and self_arg.target in _FRESH
    x = None if fresh or self_arg is None else _tensor(ctx, self_arg)

    def body(idx):
        if fill is not None:
            return E.const(fill, cdt)
        return E.const(0, cdt) if x is None else E.cast(x.load(idx), cdt)
    ctx.loop(node, body, name=name, meta=meta)
    ctx.nodes[-1].materialize = True
    return name


def scatter(ctx, node: fx.Node, ranges, value_fn, index_fn, accumulate: str | None, into: str,
            name: str | None = None, meta: TensorMeta | None = None, exact: bool = False) -> Buffer:
    """A scatter node over ``ranges``: ``value_fn(it)`` goes to ``index_fn(it) -> (index with
    ind symbols, their values)`` of ``into``, combined by ``accumulate`` (``exact``: values
    whose sums are exact in any order, deterministic even as float atomics)."""
    meta = meta or TensorMeta.of(node)
    dtype = dtypes.name_of(meta.dtype)
    if not exact:
        _check_deterministic(dtype, accumulate)
    it = variables("i", len(ranges))
    value = E.cast(value_fn(it), dtype)
    index, indirect = index_fn(it)
    name = name or node.name
    ctx.nodes.append(LoopNode(name, [node], ranges=tuple(ranges), body=value, dtype=dtype, meta=meta,
                              scatter=Scatter(into, tuple(sympy.sympify(i) for i in index), tuple(indirect),
                                              accumulate)))
    return Buffer(name, meta.shape, dtype)


def _along(x, dim: int, index, it):
    """The target index of ``scatter``-style ops: ``it`` with ``index[it]`` at ``dim``."""
    ind = E.cast(index.load(it), "i64")  # no Python-style negatives: eager's scatter refuses them
    return it[:dim] + (E.indirect_symbol(0),) + it[dim + 1:], (ind,)


def _with_include_self(ctx, node, a, kind: str, dim: int, index, x, tgt: str) -> str:
    """``include_self=False``: the identity written first where any value goes (a plain write:
    duplicates write the same value), so the reduction sees only the scattered values."""
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    ident = _identity(kind, dtype)
    cdt = dtypes.compute_type(dtype)
    first = f"{node.name}_cleared"
    scatter(ctx, node, index.shape, lambda it: E.const(ident, cdt), lambda it: _along(x, dim, index, it),
            None, tgt, name=first)
    ctx.nodes[-1].materialize = True
    return first


def _scatter_reduce(ctx, node, a, kind: str, include_self: bool = True):
    x = _tensor(ctx, a["self"])
    index = _tensor(ctx, a["index"])
    if x.ndim == 0 or index.ndim != x.ndim:
        raise Unsupported("scatter of a 0-d tensor or an index of another rank")
    dim = a["dim"] % x.ndim
    src = a.get("src")
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    if kind is not None and dtype == "bool":
        raise Unsupported("a reducing scatter of booleans")
    cdt = dtypes.compute_type(dtype)
    srcv = _tensor(ctx, src) if src is not None else None
    value = a.get("value")

    def value_fn(it):
        return E.cast(srcv.load(it), cdt) if srcv is not None else E.const(value, cdt)
    tgt = target(ctx, node, a["self"], f"{node.name}_init")
    if kind is not None and not include_self:
        tgt = _with_include_self(ctx, node, a, kind, dim, index, x, tgt)
    return scatter(ctx, node, index.shape, value_fn, lambda it: _along(x, dim, index, it), kind, tgt)


@lowering(aten.scatter.value, aten.scatter.src, aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter(ctx, node, a):
    """Collision-free one-hot writes (an index of size 1 along ``dim`` and the self's size
    elsewhere, as nll_loss's backward makes) are one pointwise node; the rest scatter. The
    one-hot form compares each element's position with the index, so an index outside the dim
    matches nothing: it is checked against the dim (a ``checked`` node), or the write would be
    dropped where eager raises."""
    x = _tensor(ctx, a["self"])
    index = _tensor(ctx, a["index"])
    dim = a["dim"] % max(x.ndim, 1)
    reduce = a.get("reduce")
    if reduce is None and index.ndim == x.ndim and x.ndim and index.shape[dim] == 1 and all(
            index.shape[d] == x.shape[d] for d in range(x.ndim) if d != dim):
        src, value = a.get("src"), a.get("value")
        cdt = dtypes.compute_type(x.dtype)
        srcv = _tensor(ctx, src) if src is not None else None

        def body(idx):
            at = idx[:dim] + (sympy.Integer(0),) + idx[dim + 1:]
            hit = E.op("eq", E.checked(index.load(at), x.shape[dim]), E.cast(E.index(idx[dim]), "i64"))
            new = E.cast(srcv.load(at), cdt) if srcv is not None else E.const(value, cdt)
            return E.where(hit, new, E.cast(x.load(idx), cdt))
        return ctx.loop(node, body)
    if reduce not in (None, "add", "sum"):
        raise Unsupported(f"scatter with reduce={reduce!r} (no atomic product)")
    return _scatter_reduce(ctx, node, a, None if reduce is None else "add")


@lowering(aten.scatter_add.default)
def _scatter_add(ctx, node, a):
    return _scatter_reduce(ctx, node, a, "add")


@lowering(aten.scatter_reduce.two)
def _scatter_reduce_two(ctx, node, a):
    reduce, include_self = a["reduce"], a["include_self"]
    if reduce == "mean":
        return _scatter_mean(ctx, node, a, include_self)
    kind = {"sum": "add", "amax": "max", "amin": "min"}.get(reduce)
    if kind is None:
        raise Unsupported(f"scatter_reduce {reduce!r} (no atomic product)")
    return _scatter_reduce(ctx, node, a, kind, include_self)


def _scatter_mean(ctx, node, a, include_self: bool):
    """mean = sum / count, each a scatter-add (the count starts at 1 for self's own value, at
    0 where include_self=False leaves it out; an element nothing reaches keeps self's value:
    its sum is self and its count 1); integers divide with floor, as torch."""
    x = _tensor(ctx, a["self"])
    index, src = _tensor(ctx, a["index"]), _tensor(ctx, a["src"])
    if x.ndim == 0 or index.ndim != x.ndim:
        raise Unsupported("scatter of a 0-d tensor or an index of another rank")
    dim = a["dim"] % x.ndim
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    if dtype == "bool":
        raise Unsupported("the mean of booleans")
    cdt = dtypes.compute_type(dtype)
    meta = TensorMeta.of(node)
    count_meta = TensorMeta(meta.shape, meta.stride, meta.hint_shape, torch.int64, meta.device)
    at = lambda it: _along(x, dim, index, it)  # noqa: E731
    total_t = target(ctx, node, a["self"], f"{node.name}_sum_init")
    if not include_self:
        total_t = _with_include_self(ctx, node, a, "add", dim, index, x, total_t)
    total = scatter(ctx, node, index.shape, lambda it: E.cast(src.load(it), cdt), at, "add", total_t,
                    name=f"{node.name}_sum")
    # the count, in int64: one per value, plus self's own where it is included
    count_t = f"{node.name}_count_init"
    ctx.loop(node, lambda idx: E.const(1, "i64"), name=count_t, meta=count_meta)
    ctx.nodes[-1].materialize = True
    if not include_self:
        scatter(ctx, node, index.shape, lambda it: E.const(0, "i64"), at, None, count_t,
                name=f"{node.name}_count_cleared", meta=count_meta)
        ctx.nodes[-1].materialize = True
        count_t = f"{node.name}_count_cleared"
    count = scatter(ctx, node, index.shape, lambda it: E.const(1, "i64"), at, "add", count_t,
                    name=f"{node.name}_count", meta=count_meta)

    def mean(idx):
        s, c = E.cast(total.load(idx), cdt), E.cast(count.load(idx), cdt)
        return E.op("truediv" if dtypes.is_float(dtype) else "floordiv", s, c)
    return ctx.loop(node, mean)


@lowering(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(ctx, node, a):
    x = _tensor(ctx, a["self"])
    values = ctx.value(a["values"])
    indices = list(a["indices"])
    used = [k for k, t in enumerate(indices) if t is not None]
    if not used:
        raise Unsupported("index_put without index tensors")
    idx_vals = []
    for k in used:
        v = _tensor(ctx, indices[k])
        if v.dtype not in ("i64", "i32"):
            raise Unsupported("boolean mask indexing (data-dependent shape)")
        idx_vals.append(v)
    accumulate = "add" if a["accumulate"] else None
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    if accumulate and dtype == "bool":
        raise Unsupported("accumulating booleans")
    bshape = list(torch.broadcast_shapes(*[tuple(indices[k].meta["val"].shape) for k in used]))
    from tilewright.compiler.graph import to_sympy

    bshape = [to_sympy(s) for s in bshape]
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest = [d for d in range(x.ndim) if d not in used]
    bpos = used[0] if adjacent else 0
    space = (list(x.shape[:bpos]) + bshape + [x.shape[d] for d in rest if d >= bpos]) if adjacent else \
        (bshape + [x.shape[d] for d in rest])
    nb = len(bshape)
    cdt = dtypes.compute_type(dtype)

    def index_fn(it):
        b = it[bpos:bpos + nb]
        ind = []
        for k, v in zip(used, idx_vals):
            ind.append(_wrapped(v.load(broadcast_index(v.shape, b)), x.shape[k]))
        others = iter(it[:bpos] + it[bpos + nb:])
        return tuple(E.indirect_symbol(used.index(d)) if d in used else next(others) for d in range(x.ndim)), ind

    def value_fn(it):
        if isinstance(values, Scalar):
            return E.const(values.value, cdt)
        return E.cast(values.load(broadcast_index(values.shape, it)), cdt)
    tgt = target(ctx, node, a["self"], f"{node.name}_init")
    return scatter(ctx, node, space, value_fn, index_fn, accumulate, tgt)


@lowering(aten.index_add.default)
def _index_add(ctx, node, a):
    x, index, source = _tensor(ctx, a["self"]), _tensor(ctx, a["index"]), _tensor(ctx, a["source"])
    alpha = a.get("alpha", 1)
    if x.ndim == 0 or isinstance(alpha, fx.Node):
        raise Unsupported("index_add of a 0-d tensor or a symbolic alpha")
    dim = a["dim"] % x.ndim
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    cdt = dtypes.compute_type(dtype)

    def index_fn(it):
        ind = E.cast(index.load((it[dim],) if index.ndim else ()), "i64")  # eager refuses negatives
        return it[:dim] + (E.indirect_symbol(0),) + it[dim + 1:], (ind,)

    def value_fn(it):
        v = E.cast(source.load(it), cdt)
        return v if alpha == 1 else v * E.const(alpha, cdt)
    tgt = target(ctx, node, a["self"], f"{node.name}_init")
    return scatter(ctx, node, source.shape, value_fn, index_fn, "add", tgt)


@lowering(aten.embedding_dense_backward.default)
def _embedding_dense_backward(ctx, node, a):
    """The weight's gradient: zeros, and each token's gradient row added at its index (none
    for ``padding_idx``)."""
    grad, ids = _tensor(ctx, a["grad_output"]), _tensor(ctx, a["indices"])
    if a["scale_grad_by_freq"]:
        raise Unsupported("scale_grad_by_freq (a count per index first)")
    padding = a["padding_idx"]
    if isinstance(padding, fx.Node):
        raise Unsupported("a symbolic padding_idx")
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    cdt = dtypes.compute_type(dtype)
    rows = TensorMeta.of(node).shape[0]

    def index_fn(it):
        return (E.indirect_symbol(0), it[-1]), (E.cast(ids.load(it[:-1]), "i64"),)

    def value_fn(it):
        v = E.cast(grad.load(it), cdt)
        if padding is None or padding < 0:
            return v
        return E.where(E.op("eq", E.cast(ids.load(it[:-1]), "i64"), E.const(padding, "i64")), E.const(0, cdt), v)
    tgt = target(ctx, node, None, f"{node.name}_init")
    return scatter(ctx, node, grad.shape, value_fn, index_fn, "add", tgt)


@lowering(aten.histc.default)
def _histc(ctx, node, a):
    """Counts per bin: a scatter-add of one per element into zeros, at torch's bin
    ``int((x - min) * bins / (max - min))`` (``max`` itself in the last bin); elements outside
    [min, max] (NaN too) add 0. The counts are small integers, exact in any order, so the
    atomics are deterministic."""
    x = _tensor(ctx, a["self"])
    bins, lo, hi = a["bins"], a["min"], a["max"]
    if any(isinstance(v, fx.Node) for v in (bins, lo, hi)) or not lo < hi:
        raise Unsupported("histc with symbolic or data-dependent (min == max) edges")
    dtype = dtypes.name_of(TensorMeta.of(node).dtype)
    cdt = dtypes.compute_type(dtype)
    if not dtypes.is_float(x.dtype):
        raise Unsupported("histc of integers")

    def parts(it):
        v = E.cast(x.load(it), cdt)
        inside = E.op("logical_and", E.op("ge", v, E.const(lo, cdt)), E.op("le", v, E.const(hi, cdt)))
        pos = E.cast((v - E.const(lo, cdt)) * E.const(bins, cdt) / E.const(hi - lo, cdt), "i64")
        # clamped at both ends (inside, pos >= 0 already): a range the bounds analysis proves
        pos = E.op("maximum", E.op("minimum", pos, E.const(bins - 1, "i64")), E.const(0, "i64"))
        return inside, pos

    def value_fn(it):
        inside, _ = parts(it)
        return E.where(inside, E.const(1, cdt), E.const(0, cdt))

    def index_fn(it):
        inside, pos = parts(it)
        return (E.indirect_symbol(0),), (E.where(inside, pos, E.const(0, "i64")),)
    tgt = target(ctx, node, None, f"{node.name}_init")
    return scatter(ctx, node, x.shape, value_fn, index_fn, "add", tgt, exact=True)

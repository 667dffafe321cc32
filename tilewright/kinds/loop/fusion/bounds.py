"""What a loop kernel's integer inputs may hold: the range in which tuning draws the values of
a buffer that indexes a gather or a scatter (``[0, size)`` of the dim it indexes, mapped back
through ``a * value + b``: ``nll_loss(x, -t)`` indexes with ``-t``, so ``t`` is drawn in
``(-size, 0]``), and a ``checked`` index's bound (:func:`_index_bounds`, recorded on the
kernel's :class:`~tilewright.ir.kernel.Buffer`). Part of building a fused group's kernel
(:mod:`tilewright.kinds.loop.fusion.build`).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.compiler.graph import TensorMeta
from tilewright.ir import dtypes
from tilewright.ir import expr as E


def _bound(e: sympy.Expr) -> Any:
    """A bound as an int when it is one, else the expression of size symbols."""
    return int(e) if not e.free_symbols else e


def _index_bounds(values: list[E.Node], metas: dict[str, TensorMeta], scatter: dict | None = None,
                  store_index: dict | None = None, extents: dict[sympy.Symbol, sympy.Expr] | None = None,
                  ) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
    """Integer buffers whose values index a gather or a scatter -> ``(lo, hi)``: tuning draws
    their random values in ``[lo, hi)``, so that the index they make lies in ``[0, size)`` of the
    dim it indexes, or in ``[-size, size)`` where the index wraps negative values as eager's
    advanced indexing and ``index_put`` do (where the index is ``a * value + b``; else the value
    itself in it), with expressions of the graph's size symbols where that dim is dynamic, so a
    bucket's inputs fit its own tables; a ``checked`` index's bound (a view's extent, a one-hot
    scatter's dim) too, wherever it is used. A buffer with several uses gets their intersection
    (``x[i + 5] + x[i - 5]`` over 8 rows: ``i`` in ``[-3, 3)``), the first use's range where the
    intersection is empty. ``extents``: the loop variables' extents, which bound an iota added
    to the value (``b`` is then a range: a static KV cache written at ``past + arange(new)``)."""
    ranges: dict[str, list[tuple[sympy.Expr, sympy.Expr]]] = {}

    def bound_loads(v: E.Node, size: sympy.Expr) -> None:
        inner, wraps = _unwrapped(v)
        affine = _affine_in_one_load(inner, extents or {})
        low = -size if wraps else sympy.Integer(0)  # the index's own range: [low, size - 1]
        for ld in E.toposort([v]):
            if ld.op == "load":
                lo, hi = sympy.Integer(0), size
                if affine is not None and affine[0] == ld.arg[0]:
                    # index = a*value + b, b in [b_lo, b_hi], inside [low, size - 1]: value in [lo, hi)
                    _, a, b_lo, b_hi = affine
                    if a > 0:
                        lo = sympy.ceiling((low - b_lo) / sympy.Integer(a))
                        hi = sympy.floor((size - 1 - b_hi) / a) + 1
                    else:
                        lo = sympy.ceiling((b_hi - size + 1) / -a)
                        hi = sympy.floor((b_lo - low) / sympy.Integer(-a)) + 1
                    hi = sympy.Max(hi, lo + 1)  # never empty (an index no value keeps in range)
                ranges.setdefault(ld.arg[0], []).append((lo, hi))

    uses = [(n.arg[0], n.arg[1], E.load_indirect(n)) for n in E.toposort(values)
            if n.op == "load" and E.load_indirect(n)]
    uses += [(name, store_index[name], extra[0]) for name, extra in (scatter or {}).items()]
    for name, index, indirect in uses:
        target = metas[name]
        for k, v in enumerate(indirect):
            sym = E.indirect_symbol(k)
            dims = [d for d, e in enumerate(index) if sym in sympy.sympify(e).free_symbols]
            if dims and v.op != "checked":
                bound_loads(v, sympy.sympify(target.shape[dims[0]]))
    for n in E.toposort(values + [v for _, _, ind in uses for v in ind]):
        if n.op == "checked":
            bound_loads(n.src[0], sympy.sympify(n.src[1].arg))
    return {name: intersect(rs) for name, rs in ranges.items()}


def intersect(ranges: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """The values in every ``[lo, hi)`` of ``ranges``; the first range where they provably have
    none in common (the draws then fail one use, as they would any)."""
    lo, hi = ranges[0]
    for l2, h2 in ranges[1:]:
        lo, hi = sympy.Max(lo, l2), sympy.Min(hi, h2)
    width = sympy.sympify(hi - lo)
    return ranges[0] if width.is_number and width <= 0 else (lo, hi)


def _unwrapped(v: E.Node) -> tuple[E.Node, bool]:
    """An index value without what the lowering puts around it, and whether that included the
    negative-index wrap (``where(v < 0, v + size, v)``, eager's advanced indexing and
    ``index_put``: a value in ``[-size, 0)`` is valid there); a constant taken for some lanes
    (``where(t != ignore_index, t, 0)``, as ``nll_loss`` indexes) is stripped too."""
    wraps = False
    while v.op == "where":
        if v.src[0].op == "lt" and v.src[0].src[0] == v.src[2]:
            v, wraps = v.src[2], True
        elif v.src[2].op == "const":
            v = v.src[1]
        elif v.src[1].op == "const":
            v = v.src[2]
        else:
            break
    return v, wraps


def _affine_in_one_load(v: E.Node, extents: dict[sympy.Symbol, sympy.Expr]
                        ) -> tuple[str, int, sympy.Expr, sympy.Expr] | None:
    """``(buffer, a, b_lo, b_hi)`` where index value ``v`` is ``a * load(buffer) + b`` with an
    integer ``a != 0`` and ``b`` an integer, or a sum with iotas (``index`` nodes) whose range
    over the loop ``extents`` is known: ``b`` in ``[b_lo, b_hi]`` (``w[i + 2]``, ``w[2 * i]``,
    ``w[-i]``, ``w[i - 1]``, ``w[i + arange(n)]``); else None: an index of any other form keeps
    the bounds of the dim's size."""
    iotas: dict[sympy.Symbol, tuple[sympy.Expr, sympy.Expr]] = {}

    def walk(n: E.Node) -> sympy.Expr | None:
        if n.op == "load":
            return sympy.Symbol(n.arg[0])
        if n.op == "const" and isinstance(n.arg, int) and not isinstance(n.arg, bool):
            return sympy.Integer(n.arg)
        if n.op == "index":
            rng = _interval(sympy.sympify(n.arg), extents)
            if rng is None:
                return None
            t = sympy.Dummy("iota")
            iotas[t] = rng
            return t
        if n.op == "cast" and not dtypes.is_float(n.dtype):
            return walk(n.src[0])
        args = [walk(s) for s in n.src]
        if any(a is None for a in args):
            return None
        if n.op == "add":
            return args[0] + args[1]
        if n.op == "sub":
            return args[0] - args[1]
        if n.op == "mul":
            return args[0] * args[1]
        if n.op == "neg":
            return -args[0]
        return None

    e = walk(v)
    loads = [] if e is None else [s for s in e.free_symbols if s not in iotas]
    if len(loads) != 1:
        return None
    (x,) = loads
    a = sympy.expand(e).coeff(x)
    rest = sympy.expand(e - a * x)
    if not a.is_Integer or a == 0 or x in rest.free_symbols:
        return None
    b = _interval(rest, {}, iotas)
    if b is None:
        return None
    return (x.name, int(a), b[0], b[1])


def _interval(e: sympy.Expr, extents: dict[sympy.Symbol, sympy.Expr],
              known: dict[sympy.Symbol, tuple[sympy.Expr, sympy.Expr]] | None = None,
              ) -> tuple[sympy.Expr, sympy.Expr] | None:
    """Inclusive bounds of integer expression ``e`` over loop variables in ``[0, extent - 1]``
    and symbols of ``known`` ranges: sums, products by a number, ``floor``/``ceiling`` and
    ``Mod`` by a positive size (what view index maps are made of); None for anything else (a
    size symbol standing alone, a product of two variables). Sizes may be symbols."""
    known = known or {}
    if e.is_Integer or e.is_Rational:
        return e, e
    if isinstance(e, sympy.Symbol):
        if e in known:
            return known[e]
        if e in extents:
            return sympy.Integer(0), extents[e] - 1
        return None
    if isinstance(e, sympy.Add):
        parts = [_interval(t, extents, known) for t in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*[p[0] for p in parts]), sympy.Add(*[p[1] for p in parts])
    if isinstance(e, sympy.Mul):
        number = [t for t in e.args if t.is_number]
        other = [t for t in e.args if not t.is_number]
        if len(other) != 1:
            return None
        c = sympy.Mul(*number)
        r = _interval(other[0], extents, known)
        if r is None:
            return None
        return (c * r[0], c * r[1]) if c >= 0 else (c * r[1], c * r[0])
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        r = _interval(e.args[0], extents, known)
        return None if r is None else (type(e)(r[0]), type(e)(r[1]))
    if isinstance(e, sympy.Mod) and e.args[1].is_positive:
        return sympy.Integer(0), e.args[1] - 1
    return None

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
from tilewright.ir.bounds import value_range


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
    integer ``a != 0`` and ``b`` in ``[b_lo, b_hi]``: a constant, or anything without a load whose
    range :func:`~tilewright.ir.bounds.value_range` knows over the loop ``extents`` (an iota:
    ``w[i + 2]``, ``w[2 * i]``, ``w[-i]``, ``w[i - 1]``, ``w[i + arange(n)]``); else None: an
    index of any other form keeps the bounds of the dim's size."""
    if len({n.arg[0] for n in E.toposort([v]) if n.op == "load"}) != 1:
        return None
    memo: dict = {}

    def walk(n: E.Node) -> tuple[int, Any, Any] | None:  # (a, b_lo, b_hi) of n
        if not any(m.op == "load" for m in E.toposort([n])):
            lo, hi = value_range(n, extents, memo)
            return None if lo is None or hi is None else (0, lo, hi)
        if n.op == "load":
            return 1, sympy.Integer(0), sympy.Integer(0)
        if n.op == "cast" and dtypes.is_int(n.dtype):
            return walk(n.src[0])
        if n.op == "neg":
            r = walk(n.src[0])
            return None if r is None else (-r[0], -r[2], -r[1])
        parts = [walk(m) for m in n.src] if n.op in ("add", "sub", "mul") else [None]
        if any(p is None for p in parts):
            return None
        if n.op == "sub":
            parts[1] = (-parts[1][0], -parts[1][2], -parts[1][1])
        if n.op in ("add", "sub"):
            return parts[0][0] + parts[1][0], parts[0][1] + parts[1][1], parts[0][2] + parts[1][2]
        # mul: by a constant (the other side's range a single integer)
        for (a, lo, hi), (ca, c, ch) in (parts, parts[::-1]):
            if ca == 0 and c == ch and getattr(c, "is_Integer", False):
                return (a * int(c), lo * c, hi * c) if c >= 0 else (a * int(c), hi * c, lo * c)
        return None

    r = walk(v)
    if r is None or r[0] == 0:
        return None
    (name,) = {n.arg[0] for n in E.toposort([v]) if n.op == "load"}
    return name, r[0], r[1], r[2]

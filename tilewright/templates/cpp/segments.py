"""A pointwise row cut where its masks change: a cat's or a pad's along the last dim.

A cat along the last dim reads each piece under a mask (``x1 < 37``), a pad its input under
``0 <= x1 - 1 < 40``. In one vectorised loop over the row those are conditional loads next to
the math of every piece, and g++ 12 leaves such a loop scalar where it also calls a function (a
libmvec ``expf``: "not vectorized: control flow in loop"; its if-conversion takes no calls).
Where every comparison of the last dim's variable with a constant flips at a static point, the
row's loop is split at those points: within a segment each such comparison is a constant, so
the masks fold away (:func:`fold`), each piece's loads become plain contiguous loads and only
the piece the segment belongs to is computed (a two-piece cat's sigmoid: one ``expf`` an
element, not two).
"""

from __future__ import annotations

from typing import Iterable

import sympy

from tilewright.ir import expr as E
from tilewright.ir.expr import Node, load_mask, toposort

MAX_SEGMENTS = 8  # more pieces than this: one loop (the code would grow with each)
_CMP = {"lt": lambda d: d < 0, "le": lambda d: d <= 0, "gt": lambda d: d > 0, "ge": lambda d: d >= 0}


def _affine(n: Node, var: sympy.Symbol) -> tuple[int, int] | None:
    """``(c, k)`` where ``n`` (an index or integer constant node) is ``c*var + k`` with integer
    ``c`` and ``k``, else None."""
    if n.op == "const" and isinstance(n.arg, int) and not isinstance(n.arg, bool):
        return 0, int(n.arg)
    if n.op != "index":
        return None
    e = sympy.expand(sympy.sympify(n.arg))
    if not e.free_symbols <= {var} or not e.is_polynomial(var) or sympy.degree(e, var) > 1:
        return None
    c, k = e.coeff(var, 1), e.coeff(var, 0)
    if not (c.is_Integer and k.is_Integer):
        return None
    return int(c), int(k)


def _flip(op: str, c: int, k: int) -> int | None:
    """The first ``var`` at which ``c*var + k <op> 0`` differs from its value just below it
    (``c`` is +-1), or None where it never changes."""
    if c not in (1, -1):
        return None
    r = -k * c  # the root
    test = _CMP[op]
    for t in (r, r + 1):
        if test(c * (t - 1) + k) != test(c * t + k):
            return t
    return None


def split_points(roots: Iterable[Node], var: sympy.Symbol, extent: sympy.Expr
                 ) -> tuple[list[int], dict[Node, tuple]]:
    """The points (ascending, each inside ``(0, extent)``; any > 0 where ``extent`` is symbolic) where a comparison of ``var`` with a constant in the
    DAG of ``roots`` changes, and each such comparison -> ``(op, c, k)`` (it tests ``c*var + k
    <op> 0``). No points where there are none or more than :data:`MAX_SEGMENTS` segments."""
    cmps: dict[Node, tuple] = {}
    points: set[int] = set()
    for n in toposort(list(roots)):
        if n.op not in _CMP or len(n.src) != 2:
            continue
        a, b = (_affine(s, var) for s in n.src)
        if a is None or b is None or a[0] == b[0]:
            continue
        c, k = a[0] - b[0], a[1] - b[1]
        t = _flip(n.op, c, k)
        if t is None:
            continue
        cmps[n] = (n.op, c, k)
        if t > 0 and not (sympy.sympify(extent).is_Integer and t >= int(extent)):
            points.add(t)
    if not points or len(points) + 1 > MAX_SEGMENTS:
        return [], {}
    return sorted(points), cmps


def fold(roots: list[Node], cmps: dict[Node, tuple], at: int) -> list[Node]:
    """``roots`` on a segment starting at ``var = at`` (one with no split point inside): each
    comparison of ``cmps`` as its constant there, and what that decides folded: logical ops,
    ``where`` on a constant condition, a load under a constant mask (a plain load, or 0 with
    no read)."""
    def fn(n: Node, src: tuple[Node, ...]) -> Node | None:
        if n in cmps:
            op, c, k = cmps[n]
            return E.const(_CMP[op](c * at + k), "bool")
        consts = [s.arg if s.op == "const" else None for s in src]
        if n.op == "logical_not" and consts[0] is not None:
            return E.const(not consts[0], "bool")
        if n.op in ("logical_and", "logical_or") and len(src) == 2:
            absorbing = n.op == "logical_or"  # True absorbs an or, False an and
            for i in (0, 1):
                if consts[i] is not None and src[i].dtype == "bool":
                    if bool(consts[i]) == absorbing:
                        return E.const(absorbing, "bool")
                    other = src[1 - i]
                    return other if other.dtype == "bool" else None
            return None
        if n.op == "where" and consts[0] is not None:
            return src[1] if consts[0] else src[2]
        if n.op == "load" and load_mask(n) is not None:
            mask = src[0]
            if mask.op == "const":
                name, idx, _ = n.arg
                return E.load(name, idx, n.dtype, mask=mask, indirect=src[1:])
        return None

    return E.rewrite(roots, fn)


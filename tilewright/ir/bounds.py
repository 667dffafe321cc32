"""Which data-dependent indices a kernel must check, and which integer divisions can meet a
zero divisor that matters: the facts every emitter's bounds and division checks share.

A gather (``embedding``, ``gather``, ``index_select``, ``x[i]``) reads through an index that is
data, a scatter writes through one; an index outside its dim reads or writes memory the kernel
does not own. Eager raises (IndexError, or RuntimeError "index ... is out of bounds"); so does a
generated kernel, by a check before the access, unless the index is *proven* in range: an iota
(``index`` of the loop's own variables), a clamp (``minimum``/``maximum``), a Python modulo by a
positive size, a ``where`` whose condition bounds it, and sums and casts of those
(:func:`proven_in_range`, an interval analysis in sympy over the kernel's sizes, as Inductor's
``ValueRanges`` decide its ``check_bounds``). ``config.index_checks`` turns the checks off.

An integer division by zero raises on a CPU (RuntimeError "ZeroDivisionError", as eager); a
lane whose result nothing keeps (a ``where`` chose the other side, as a ``cat`` or ``pad`` of a
quotient does for lanes outside its part, where the masked loads read 0) must not: the
condition under which a division's value is used is :func:`live_conditions`.
"""

from __future__ import annotations

from typing import Iterable

import sympy

from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.expr import Node

Range = tuple[sympy.Expr | None, sympy.Expr | None]  # inclusive (lo, hi); None: unbounded
INT_DIVISIONS = ("floordiv", "truncdiv", "mod", "fmod")


def var_ranges(kernel) -> dict[sympy.Symbol, sympy.Expr]:
    """Each loop variable of a :class:`~tilewright.ir.kernel.LoopKernel` -> its extent."""
    out = dict(zip(kernel.x_vars, kernel.ranges))
    out.update(zip(kernel.r_vars, kernel.reduction_ranges))
    return out


def _le(a: sympy.Expr | None, b: sympy.Expr | None) -> bool:
    """Whether ``a <= b`` is proven (sizes are positive integers)."""
    if a is None or b is None:
        return False
    if isinstance(a, sympy.Max):
        return all(_le(x, b) for x in a.args)
    if isinstance(b, sympy.Min):
        return all(_le(a, x) for x in b.args)
    if isinstance(a, sympy.Min):
        return any(_le(x, b) for x in a.args)
    if isinstance(b, sympy.Max):
        return any(_le(a, x) for x in b.args)
    d = b - a
    return bool(d.is_nonnegative if d.is_nonnegative is not None else sympy.simplify(d).is_nonnegative)


def _index_range(e: sympy.Expr, extents: dict[sympy.Symbol, sympy.Expr]) -> Range:
    """Bounds of an integer index expression: affine in the loop variables (each in
    ``[0, extent - 1]``), or a ``Mod`` by a positive size."""
    return _affine_range(e, {v: (sympy.Integer(0), n - 1) for v, n in extents.items()})


def _affine_range(e: sympy.Expr, ranges: dict[sympy.Symbol, Range]) -> Range:
    """Bounds of an index expression affine in symbols of known ranges (loop variables, the
    gathered values ``ind0, ...``), or a ``Mod`` by a positive size."""
    e = sympy.sympify(e)
    if isinstance(e, sympy.Mod) and e.args[1].is_positive:
        return sympy.Integer(0), e.args[1] - 1
    if e.has(sympy.floor, sympy.Mod, sympy.ceiling):
        return None, None
    lo = hi = e
    for v in e.free_symbols & set(ranges):
        c = sympy.diff(e, v)
        if c.free_symbols & set(ranges) or not c.is_number:
            return None, None
        vlo, vhi = ranges[v]
        if c == 0:
            continue
        if vlo is None or vhi is None:
            return None, None
        lo, hi = lo.subs(v, vlo if c >= 0 else vhi), hi.subs(v, vhi if c >= 0 else vlo)
    return lo, hi


def _facts(cond: Node, negate: bool = False) -> dict[Node, Range]:
    """Bounds ``cond`` (or its negation) implies, by the node compared: ``x >= c``, ``x < c``
    with ``c`` a constant or a size, and their conjunctions (a bounds-checking ``where``, or
    the negative-index wrap ``where(x < 0, x + n, x)``)."""
    if cond.op in ("logical_and", "bitwise_and") and cond.dtype == "bool" and not negate:
        out: dict[Node, Range] = {}
        for c in cond.src:
            for x, (lo, hi) in _facts(c).items():
                plo, phi = out.get(x, (None, None))
                out[x] = (lo if lo is not None else plo, hi if hi is not None else phi)
        return out
    if cond.op == "logical_not":
        return _facts(cond.src[0], not negate)
    if cond.op not in ("ge", "gt", "lt", "le") or len(cond.src) != 2:
        return {}
    a, b = cond.src
    if b.op not in ("const", "index") or not dtypes.is_int(a.dtype):
        return {}
    c = sympy.sympify(b.arg)
    op = {"ge": "lt", "gt": "le", "lt": "ge", "le": "gt"}[cond.op] if negate else cond.op
    return {_strip(a): {"ge": (c, None), "gt": (c + 1, None), "lt": (None, c - 1), "le": (None, c)}[op]}


def _narrowed(base: Range, fact: Range) -> Range:
    lo = fact[0] if base[0] is None else base[0] if fact[0] is None else sympy.Max(base[0], fact[0])
    hi = fact[1] if base[1] is None else base[1] if fact[1] is None else sympy.Min(base[1], fact[1])
    return lo, hi


def _strip(n: Node) -> Node:
    while n.op == "cast" and dtypes.is_int(n.dtype) and dtypes.is_int(n.src[0].dtype):
        n = n.src[0]
    return n


def _truth(cond: Node, rng) -> bool | None:
    """Whether a comparison of integers is proven true or false from their ranges (None: not)."""
    if cond.op not in ("lt", "le", "gt", "ge") or not all(dtypes.is_int(x.dtype) for x in cond.src):
        return None
    (al, ah), (bl, bh) = rng(cond.src[0]), rng(cond.src[1])
    strict = cond.op in ("lt", "gt")
    lo_a, hi_a, lo_b, hi_b = (al, ah, bl, bh) if cond.op in ("lt", "le") else (bl, bh, al, ah)
    # a < b (a <= b): true when hi_a < lo_b (<=), false when lo_a >= hi_b (>)
    if _le(hi_a + 1 if strict and hi_a is not None else hi_a, lo_b):
        return True
    if _le(hi_b, lo_a - 1 if not strict and lo_a is not None else lo_a):
        return False
    return None


def value_range(n: Node, extents: dict[sympy.Symbol, sympy.Expr], memo: dict | None = None) -> Range:
    """Inclusive bounds of an integer value, ``None`` where unknown (a load is data: unknown)."""
    memo = {} if memo is None else memo
    if n in memo:
        return memo[n]

    def rng(m: Node) -> Range:
        return value_range(m, extents, memo)

    out: Range = (None, None)
    if n.op == "const" and isinstance(n.arg, (int, bool)):
        out = (sympy.Integer(int(n.arg)), sympy.Integer(int(n.arg)))
    elif n.op == "index":
        out = _index_range(n.arg, extents)
    elif n.op == "checked":  # past its check: inside its bound (a failed check raises)
        _, bh = rng(n.src[1])
        out = _narrowed(rng(n.src[0]), (sympy.Integer(0), None if bh is None else bh - 1))
    elif n.op == "cast" and n.dtype == "bool":
        out = (sympy.Integer(0), sympy.Integer(1))
    elif n.op == "cast" and dtypes.is_int(n.dtype) and (dtypes.is_int(n.src[0].dtype) or n.src[0].dtype == "bool"):
        out = rng(n.src[0]) if n.src[0].dtype != "bool" else (sympy.Integer(0), sympy.Integer(1))
    elif n.op in ("add", "sub") and dtypes.is_int(n.dtype):
        (al, ah), (bl, bh) = rng(n.src[0]), rng(n.src[1])
        if n.op == "add":
            out = (None if al is None or bl is None else al + bl, None if ah is None or bh is None else ah + bh)
        else:
            out = (None if al is None or bh is None else al - bh, None if ah is None or bl is None else ah - bl)
    elif n.op == "mul" and dtypes.is_int(n.dtype):  # by a constant (an iota's step)
        for x, c in ((n.src[0], n.src[1]), (n.src[1], n.src[0])):
            if c.op == "const" and not isinstance(c.arg, float):
                lo, hi = rng(x)
                k = int(c.arg)
                lo, hi = (None if lo is None else lo * k, None if hi is None else hi * k)
                out = (lo, hi) if k >= 0 else (hi, lo)
                break
    elif n.op in ("minimum", "maximum") and dtypes.is_int(n.dtype):
        (al, ah), (bl, bh) = rng(n.src[0]), rng(n.src[1])
        if n.op == "minimum":  # below whichever bound is known; above only if both are
            out = (None if al is None or bl is None else sympy.Min(al, bl),
                   ah if bh is None else bh if ah is None else sympy.Min(ah, bh))
        else:
            out = (al if bl is None else bl if al is None else sympy.Max(al, bl),
                   None if ah is None or bh is None else sympy.Max(ah, bh))
    elif n.op == "mod" and dtypes.is_int(n.dtype):  # Python's modulo: the divisor's sign
        bl, bh = rng(n.src[1])
        if bl is not None and bh is not None and _le(sympy.Integer(1), bl):
            out = (sympy.Integer(0), bh - 1)
    elif n.op == "where" and _truth(n.src[0], rng) is not None:  # one side never taken (x < 0 for x >= 0)
        out = rng(n.src[1] if _truth(n.src[0], rng) else n.src[2])
    elif n.op == "where":
        # each side under what the condition says of the values it compares (a fresh memo:
        # the nodes above them narrow too)
        cond, a, b = n.src

        def side(x: Node, negate: bool) -> Range:
            facts = _facts(cond, negate)
            if not facts:
                return rng(x)
            sub = {m: _narrowed(rng(m), f) for m, f in facts.items()}
            return value_range(x, extents, sub)

        (al, ah), (bl, bh) = side(a, False), side(b, True)
        out = (None if al is None or bl is None else sympy.Min(al, bl),
               None if ah is None or bh is None else sympy.Max(ah, bh))
    memo[n] = out
    return out


def proven_in_range(n: Node, size: sympy.Expr, extents: dict[sympy.Symbol, sympy.Expr],
                    memo: dict | None = None) -> bool:
    """Whether integer value ``n`` is proven to lie in ``[0, size)`` at every point of a kernel
    whose loop variables span ``extents``."""
    lo, hi = value_range(n, extents, memo)
    return _le(sympy.Integer(0), lo) and _le(hi, sympy.sympify(size) - 1)


def check_needed(n: Node, extents: dict[sympy.Symbol, sympy.Expr], memo: dict | None = None) -> bool:
    """Whether an emitter must check ``checked`` node ``n`` (:func:`tilewright.ir.expr.checked`):
    checks are on and its value is not proven inside its bound. An emitter that checks it
    reports a value outside the bound as eager's IndexError (a device assert on a GPU) and
    passes on a value inside it (0 in place of a bad one, so nothing reads outside memory)."""
    return checks_enabled() and not proven_in_range(n.src[0], n.src[1].arg, extents, memo)


def checks_enabled() -> bool:
    """``config.index_checks``: whether kernels check the indices not proven in range."""
    from tilewright._config import config

    return bool(config.index_checks)


def live_conditions(roots: Iterable[Node], used: dict[Node, Node] | None = None) -> dict[Node, Node | None]:
    """For every node under ``roots``: the condition under which its value is used (None:
    always), from the ``where`` nodes above it (a node reached by several paths is used where
    any of them uses it); ``used``: roots used only under a condition (a combo kernel part's
    store mask). A division whose divisor is 0 only where it is not used (the lanes a ``cat``'s
    other part fills) is no error."""
    roots = list(roots)
    order = E.toposort(roots)
    live: dict[Node, Node | None | bool] = {}
    for r in roots:
        cond = (used or {}).get(r)
        if r not in live:
            live[r] = cond
        elif live[r] is not None:
            live[r] = None if cond is None else E.op("logical_or", live[r], cond)
    for n in reversed(order):
        if n not in live:
            continue
        # a reduction's operand is computed in the row's own pass, before any condition above
        # the reduction exists there: it counts as always used (no reported error is lost)
        here = None if n.op in ("reduce", "scan") else live[n]

        def give(m: Node, cond: Node | None, here=here) -> None:
            both = here if cond is None else cond if here is None else E.op("logical_and", here, cond)
            if m not in live:
                live[m] = both
            elif live[m] is not None:
                live[m] = None if both is None else E.op("logical_or", live[m], both)

        if n.op == "where":
            c, a, b = n.src
            give(c, None)
            give(a, c)
            give(b, E.op("logical_not", c))
        else:
            for s in n.src:
                give(s, None)
    return live  # type: ignore[return-value]


def int_divisions(roots: Iterable[Node]) -> list[Node]:
    """The integer divisions and remainders under ``roots`` (what can divide by zero)."""
    return [n for n in E.toposort(list(roots)) if n.op in INT_DIVISIONS and dtypes.is_int(n.dtype)]


def guard_divisions(kernel):
    """``kernel`` with each integer division's divisor replaced by 1 where its value is not
    used (:func:`live_conditions`), so that a division by zero that an emitter reports (the C++
    error flag, the interpreter's, torch's own error in the torch form) is always one eager
    meets too; the kernel itself where nothing changes."""
    import dataclasses

    roots = kernel.roots()
    divs = int_divisions(roots)
    if not divs:
        return kernel
    live = live_conditions(roots, {s.value: s.mask for s in kernel.stores if s.mask is not None})
    guarded = {d: live.get(d) for d in divs if live.get(d) is not None}
    if not guarded:
        return kernel

    def fn(n: Node, src: tuple[Node, ...]) -> Node | None:
        cond = guarded.get(n)
        if cond is None:
            return None
        a, b = src
        return E.op(n.op, a, E.where(cond, b, E.const(1, b.dtype)))

    new = iter(E.rewrite(roots, fn))
    stores = [dataclasses.replace(s, value=next(new)) for s in kernel.stores]
    stores = [dataclasses.replace(s, mask=next(new)) if s.mask is not None else s for s in stores]
    stores = [dataclasses.replace(s, indirect=tuple(next(new) for _ in s.indirect)) for s in stores]
    parts = tuple(guard_divisions(p) for p in kernel.parts)
    return dataclasses.replace(kernel, stores=tuple(stores), parts=parts)


def unchecked_dims(kernel, n: Node, idx, extents=None, memo=None) -> list[int]:
    """The dims of ``n``, a load of ``kernel`` read at ``idx``, whose index depends on gathered
    data (an indirect symbol) and is not proven inside the buffer's dim: the dims every emitter
    must check (eager's IndexError), whatever its way of reporting. An index through a view
    (``ind0 + 2`` for ``w[2:][i]``, ``9 - ind0`` for a flip) is proven from the range of the
    gathered value (a ``checked`` node's: its bound), affine maps only. ``extents``/``memo``:
    the kernel's :func:`var_ranges` and a :func:`proven_in_range` memo, when the caller keeps
    them."""
    ind = E.load_indirect(n)
    if not ind:
        return []
    extents = var_ranges(kernel) if extents is None else extents
    memo = {} if memo is None else memo
    syms = {E.indirect_symbol(k): v for k, v in enumerate(ind)}
    shape = kernel.buffer(n.arg[0]).shape
    ranges = {v: (sympy.Integer(0), x - 1) for v, x in extents.items()}
    out = []
    for d, (e, size) in enumerate(zip(idx, shape)):
        used = sympy.sympify(e).free_symbols & set(syms)
        if not used:
            continue
        ranges.update({s: value_range(syms[s], extents, memo) for s in used if s not in ranges})
        lo, hi = _affine_range(e, ranges)
        if not (_le(sympy.Integer(0), lo) and _le(hi, sympy.sympify(size) - 1)):
            out.append(d)
    return out


def unproven_gathers(kernel) -> list[Node]:
    """The loads of ``kernel`` with a data-dependent dim index not proven in range, and its
    ``checked`` indices not proven inside their bounds: what a language without a check (no
    device assert, no error flag) cannot run safely."""
    extents, memo = var_ranges(kernel), {}
    return [n for n in E.toposort(kernel.roots())
            if n.op == "load" and unchecked_dims(kernel, n, n.arg[1], extents, memo)
            or n.op == "checked" and not proven_in_range(n.src[0], n.src[1].arg, extents, memo)]

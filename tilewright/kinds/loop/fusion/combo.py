"""Combo kernels: independent loop kernels launched as one (Inductor's ``combo_kernels``
idea), their iteration spaces laid end to end along one flat dim (:func:`combine`). The
scheduler (:mod:`tilewright.kinds.loop.fusion.schedule`) picks which kernels combine.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import sympy

from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import product, same, unravel, variables
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.kinds.loop.fusion.bounds import intersect
from tilewright.kinds.loop.fusion.build import BuiltKernel, FusionError, _masked

# what a lane outside a reduction's row contributes: nothing (argmax/argmin: a value that
# wins no comparison, ties going to the lower index, which is inside the row)
_REDUCE_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def _identity_outside(v: E.Node, mask: E.Node) -> E.Node:
    """``v`` with the operand of each reduction inside it replaced by the reduction's identity
    where ``mask`` is false."""
    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op != "reduce":
            return None
        x = src[0]
        kind = n.arg
        if kind in _REDUCE_IDENTITY:
            ident = _REDUCE_IDENTITY[kind]
        else:
            ident = dtypes.extreme(x.dtype, lowest=kind in ("max", "argmax"))
        return E.Node("reduce", n.dtype, (E.where(mask, x, E.const(ident, x.dtype)),), kind)
    return E.rewrite([v], fn)[0]


def _varies_along(v: E.Node, var: sympy.Symbol) -> bool:
    """Whether ``v`` varies with ``var`` outside its reductions (a scan varies)."""
    for n in E.toposort([v], stop=lambda n: n.op == "reduce"):
        if n.op == "scan" or n.op == "load" and any(var in sympy.sympify(e).free_symbols for e in n.arg[1]) \
                or n.op == "index" and var in n.arg.free_symbols:
            return True
    return False


def _rows(n: sympy.Expr, r: sympy.Expr) -> sympy.Expr:
    """ceil(n / r): rows of length ``r`` that hold ``n`` elements."""
    if n.is_Integer and r.is_Integer:
        return sympy.Integer(-(-int(n) // int(r)))
    return sympy.floor((n + r - 1) / r)


def _lt(a: sympy.Expr, b: sympy.Expr) -> E.Node:
    return E.op("lt", E.index(a), E.index(b))


def _merged(have: Buffer | None, new: Buffer) -> Buffer:
    """One combo input read by several parts: its value bounds (what tuning draws an index
    input in) are every part's together, intersected (a part that only adds to the value, as
    ``cache_position + 8``, has none; the part scattering through it does; the first part's
    where they have no value in common)."""
    if have is None or not new.bounds:
        return have or new
    if not have.bounds:
        return dataclasses.replace(have, bounds=new.bounds)
    return dataclasses.replace(have, bounds=intersect([have.bounds, new.bounds]))


def _renamer(rename: dict[str, str], subs: dict) -> Callable[[E.Node, tuple[E.Node, ...]], E.Node | None]:
    """A :func:`~tilewright.ir.expr.rewrite` function renaming buffers and substituting symbols
    in every load and index expression."""
    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op == "load":
            return E.Node("load", n.dtype, src, (rename[n.arg[0]], tuple(i.xreplace(subs) for i in n.arg[1]), n.arg[2]))
        if n.op == "index":
            return E.Node("index", n.dtype, src, n.arg.xreplace(subs))
        return None
    return fn


def combine(parts: list[BuiltKernel]) -> BuiltKernel:
    """One kernel computing independent kernels side by side (a combo kernel): one launch
    instead of several.

    The parts' iteration spaces are laid end to end along one flat dim ``x0``. Without a
    reduction, part ``p`` owns ``x0`` in ``[offset_p, offset_p + numel_p)``. With reductions
    (the *hosts*), the rows are as long as the longest host's, ``R``; each host's rows come
    first, one after another, a host of a shorter row ``R_p`` using the lanes ``r0 < R_p`` (its
    reductions see the others as their identity: Inductor's CPU kernels put the row sums of a
    layer norm's backward and the column sums of its weight's gradient in one function, this is
    that for one launch), and every pointwise part fills whole rows of ``R`` after them, its
    element ``(x0 - offset_p) * R + r0``. Each part's loads and stores are masked to its share,
    so nothing is read or written outside it; lanes of other parts compute values nobody
    stores.

    Raises:
        FusionError: hosts of row lengths that are symbolic and differ, a shorter host with
            Welford's statistics (they count the row's lanes), a host whose rows are empty
            (length 0: an empty batch's weight gradient), or two parts that store the same value.
    """
    hosts = [p for p in parts if p.kernel.kind == "reduction"]
    order = hosts + [p for p in parts if p not in hosts]
    args: list[str] = []
    outputs: list[str] = []
    symbols: list[sympy.Symbol] = []
    for p in order:
        args += [a for a in p.args if a not in args]
        for o in p.outputs:
            if o in outputs:
                raise FusionError(f"{o} is stored by two parts")
            outputs.append(o)
        symbols += [s for s in p.symbols if s not in symbols]
    znew = {s: size_symbol(i) for i, s in enumerate(symbols)}
    x0, r0 = variables("x", 1)[0], variables("r", 1)[0]

    def row_of(p: BuiltKernel) -> sympy.Expr:
        zsub = {size_symbol(i): znew[s] for i, s in enumerate(p.symbols)}
        return product(tuple(e.xreplace(zsub) for e in p.kernel.reduction_ranges))
    R = sympy.Integer(1)
    if hosts:
        rows_r = [row_of(h) for h in hosts]
        if any(r == 0 for r in rows_r):  # an empty batch's weight gradient: no lanes to lay out
            raise FusionError("a reduction over rows of length 0")
        if all(same(r, rows_r[0]) for r in rows_r):
            R = rows_r[0]
        elif all(r.is_Integer for r in rows_r):
            R = max(rows_r)
        else:
            raise FusionError("reductions over rows of different symbolic lengths")
    inputs: dict[str, Buffer] = {}
    out_buffers: list[Buffer] = []
    stores: list[Store] = []
    parts_out: list[LoopKernel] = []
    offset = sympy.Integer(0)
    for p in order:
        k = p.kernel
        zsub = {size_symbol(i): znew[s] for i, s in enumerate(p.symbols)}
        ranges = tuple(e.xreplace(zsub) for e in k.ranges)
        numel = product(ranges)
        short = False  # a host whose rows are shorter than R
        row_mask = None  # its mask without the lanes' part: what its per-row stores need
        if numel == 0:  # no share of the space (its outputs are allocated, nothing more)
            sub, mask, rows = {}, None, sympy.Integer(0)
        elif p in hosts:
            red = tuple(e.xreplace(zsub) for e in k.reduction_ranges)
            sub = dict(zip(k.x_vars, unravel(x0 - offset, ranges))) | dict(zip(k.r_vars, unravel(r0, red)))
            mask = _lt(x0, offset + numel)
            if offset != 0:
                mask = E.op("logical_and", E.op("ge", E.index(x0), E.index(offset)), mask)
            if not same(product(red), R):
                short = True
                if any(n.arg.startswith("welford") for n in k.reductions()):
                    raise FusionError("Welford's statistics count every lane of the row: not in a shorter host")
                row_mask = mask
                mask = E.op("logical_and", mask, _lt(r0, product(red)))
            rows = numel
        else:
            flat = (x0 - offset) * R + r0 if hosts else x0 - offset
            sub = dict(zip(k.x_vars, unravel(flat, ranges)))
            mask = E.op("logical_and", E.op("ge", E.index(x0), E.index(offset)), _lt(flat, numel))
            if hosts:
                mask = E.op("logical_and", mask, _lt(x0, offset + _rows(numel, R)))
            rows = _rows(numel, R) if hosts else numel
        rename = {f"in{i}": f"in{args.index(a)}" for i, a in enumerate(p.args)}
        rename |= {f"out{i}": f"out{outputs.index(o)}" for i, o in enumerate(p.outputs)}
        subs = zsub | sub

        fn = _renamer(rename, subs)  # into the combo's flat space
        renamed = _renamer(rename, zsub)  # in the part's own space

        def buf(b: Buffer, rename=rename, zsub=zsub) -> Buffer:
            return Buffer(rename[b.name], b.dtype, tuple(e.xreplace(zsub) for e in b.shape),
                          tuple(e.xreplace(zsub) for e in b.stride),
                          tuple(x.xreplace(zsub) if isinstance(x, sympy.Basic) else x for x in b.bounds)
                          if b.bounds else None,
                          rename[b.init] if b.init else None)

        for b in k.inputs:
            inputs[rename[b.name]] = _merged(inputs.get(rename[b.name]), buf(b))
        out_buffers.extend(buf(b) for b in k.outputs)
        for sp in k.parts or (k,):  # the part in its own space, under the combo's names
            part_stores = tuple(
                Store(rename[st.buffer], tuple(i.xreplace(zsub) for i in st.index), E.rewrite([st.value], renamed)[0],
                      None if st.mask is None else E.rewrite([st.mask], renamed)[0],
                      tuple(E.rewrite(list(st.indirect), renamed)), st.accumulate) for st in sp.stores)
            parts_out.append(LoopKernel(tuple(e.xreplace(zsub) for e in sp.ranges),
                                        tuple(e.xreplace(zsub) for e in sp.reduction_ranges),
                                        tuple(buf(b) for b in sp.inputs), tuple(buf(b) for b in sp.outputs),
                                        part_stores))
        for s in k.stores if numel != 0 else ():  # an empty part has nothing to write
            value = _masked(E.rewrite([s.value], fn)[0], mask)
            own_mask = mask
            if short:  # the lanes past its row add the identity to its reductions
                value = _identity_outside(value, mask)
                if not (_varies_along(value, r0) or s.indirect or s.mask is not None):
                    own_mask = row_mask  # a value per row is stored once per row
            smask = own_mask if s.mask is None else E.op("logical_and", mask, E.rewrite([s.mask], fn)[0])
            ind = tuple(_masked(v, mask) for v in E.rewrite(list(s.indirect), fn))
            stores.append(Store(rename[s.buffer], tuple(i.xreplace(subs) for i in s.index), value, smask,
                                ind, s.accumulate))
        offset = offset + rows
    kernel = LoopKernel((offset,), (R,) if hosts else (),
                        tuple(inputs[f"in{i}"] for i in range(len(args))), tuple(out_buffers), tuple(stores),
                        tuple(parts_out))
    return BuiltKernel(kernel, args, outputs, symbols)



__all__ = ["combine"]

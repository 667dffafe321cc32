"""A group of loop nodes -> one loop kernel (:class:`~tilewright.ir.kernel.LoopKernel`).

The kernel's iteration space comes from the group: a reduction group iterates over its
reductions' outer dims (``x``) and reduced dims (``r``); a pointwise group over the shape of the
values it stores. Where two members see the same space split differently (``(B*S, H)`` and
``(B, S, H)``), the kernel takes the finer split and each member's indices become sums of its
variables (:func:`~tilewright.ir.index.refine`).

Members whose value is needed outside the group (or is a graph output) are stored; every other
member is inlined: a load of it becomes its own expression at the loaded index, its variables
substituted (views in between are already index maps). A reduction is never recomputed: a
member may read it only at its own row, in registers. Whatever breaks these rules raises
:class:`FusionError`, and the scheduler keeps those nodes apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from tilewright.compiler.graph import LoopNode, TensorMeta
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import (
    group_index, is_iter_var, product, refine, same, simplify, static_numel, subsampling, variables,
)
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol
from tilewright.kinds.loop.fusion.bounds import _bound, _index_bounds


class FusionError(Exception):
    """These loop nodes cannot be one kernel (the message says why)."""


@dataclass
class BuiltKernel:
    """A group's kernel and how its canonical names bind to the graph."""

    kernel: LoopKernel
    args: list[str]
    outputs: list[str]
    symbols: list[sympy.Symbol]


def _nonunit(shape) -> tuple[sympy.Expr, ...]:
    return tuple(s for s in shape if s != 1)


def _refine_all(shapes: list[tuple[sympy.Expr, ...]]) -> tuple[sympy.Expr, ...]:
    space = _nonunit(shapes[0])
    for s in shapes[1:]:
        r = refine(space, s)
        if r is None:
            raise FusionError(f"iteration spaces {space} and {tuple(s)} do not line up")
        space = r
    return space


class _Builder:
    def __init__(self, members: list[LoopNode], stored: set[str], metas: dict[str, TensorMeta],
                 inline: dict[str, LoopNode] | None = None, by_flow: bool = False):
        self.members = {m.name: m for m in members}
        self.inline = {k: v for k, v in (inline or {}).items() if k not in self.members}
        self.order = members
        self.stored = [m for m in members if m.name in stored]
        if not self.stored:
            raise FusionError("a group that stores nothing")
        for m in members:
            if m.scatter is not None and m.scatter.target in self.members:
                raise FusionError(f"{m.name} scatters into {m.scatter.target}, which must be complete "
                                  "before its kernel starts (no grid-wide barrier)")
        self.metas = metas
        reductions = [m for m in members if m.is_reduction]  # and scans: row ops
        if reductions:
            outer = [r.outer_ranges for r in reductions]
            self.x = _refine_all(outer) if any(_nonunit(o) for o in outer) else ()
            if any(_nonunit(o) for o in outer):
                for r in reductions:
                    if not same(product(r.outer_ranges), product(self.x)):
                        raise FusionError("reductions over different outer spaces")
            self.r = _refine_all([r.reduction_ranges for r in reductions]) or (sympy.Integer(1),)
            for r in reductions:
                if not same(product(r.reduction_ranges), product(self.r)):
                    raise FusionError("reductions over different reduced spaces")
        else:
            numels = {sympy.expand(product(m.ranges)) for m in self.stored}
            if len(numels) > 1 and not all(same(a, b) for a in numels for b in numels):
                self.x = self._subsampling_space(members)
            else:
                self.x = _refine_all([m.ranges for m in self.stored])
            self.r = ()
        self.xv, self.rv = variables("x", len(self.x)), variables("r", len(self.r))
        self.var_ranges = dict(zip(self.xv, self.x)) | dict(zip(self.rv, self.r))
        self.own: dict[str, tuple[sympy.Expr, ...]] = {}
        # members stored at every s-th element of the space's last dim (see _subsampled)
        self.store_masks: dict[str, E.Node] = {}
        self.red_vars: dict[str, dict[sympy.Symbol, sympy.Expr]] = {}
        self.by_flow = by_flow
        for m in members:
            self._map(m)
        self._place_by_flow()
        unplaced = [s.name for s in self.stored if s.name not in self.own]
        if unplaced:
            m = self.members[unplaced[0]]
            raise FusionError(f"{m.name} {m.ranges} fits neither the outer nor the whole space")
        self.memo: dict[tuple, E.Node] = {}

    # -- where each member sits in the kernel's space ----------------------------------------
    def _map(self, m: LoopNode) -> None:
        stored = m.name in {s.name for s in self.stored}
        if self.by_flow and not m.is_reduction:
            return  # placed by :meth:`_place_by_flow`
        try:
            if m.is_reduction:
                own = group_index(m.outer_ranges, self.x, self.xv)
                self.red_vars[m.name] = dict(zip(variables("j", len(m.reduction_ranges)),
                                                 group_index(m.reduction_ranges, self.r, self.rv)))
                if m.is_scan:  # its own element: the row's position at the scanned dim
                    d = m.scan_dim
                    own = own[:d] + (self.red_vars[m.name][variables("j", 1)[0]],) + own[d:]
                self.own[m.name] = own
            elif same(product(m.ranges), product(self.x)):
                self.own[m.name] = group_index(m.ranges, self.x, self.xv)
            elif self.r and same(product(m.ranges), product(self.x) * product(self.r)):
                self.own[m.name] = group_index(m.ranges, self.x + self.r, self.xv + self.rv)
            elif stored and (place := self._subsampled(m)) is not None:
                self.own[m.name], self.store_masks[m.name] = place
        except ValueError as e:
            if not m.is_reduction:
                return  # perhaps the data flow places it (:meth:`_place_by_flow`)
            # a member that is only inlined needs no place of its own: its consumers read it at
            # their index (a transpose feeding a clone); one that is stored does
            if m.is_reduction or stored:
                raise FusionError(f"{m.name}: {e}") from e

    def _subsampling_space(self, members: list[LoopNode]) -> tuple[sympy.Expr, ...]:
        """A pointwise group whose stored values differ in size: the space of its largest
        member, when every stored one is it or a subsampling of its last dim (a quantisation's
        packed bytes and block scales, stored from the kernel of the value they quantise)."""
        largest = max(members, key=lambda m: static_numel(m.ranges))
        space = _nonunit(largest.ranges)
        for m in self.stored:
            if not same(product(m.ranges), product(space)) and subsampling(m.ranges, space) is None:
                raise FusionError("stored values of different sizes")
        return space

    def _subsampled(self, m: LoopNode) -> tuple[tuple[sympy.Expr, ...], E.Node] | None:
        """Where a member that is the kernel space subsampled along its last dim (one element
        per ``s``: a packed pair of E2M1 codes, a block's scale) sits, and the store mask that
        keeps the lanes at multiples of ``s``. The space's last dim is its innermost variable
        (``r`` in a reduction), so the lanes of one element are neighbours."""
        space, kvars = (self.x + self.r, self.xv + self.rv) if self.r else (self.x, self.xv)
        step = subsampling(m.ranges, space) if space else None
        if step is None:
            return None
        lead = group_index(_nonunit(m.ranges)[:-1], space[:-1], kvars[:-1])
        last = kvars[-1]
        it = iter(lead + (sympy.floor(last / step),))
        own = tuple(sympy.Integer(0) if size == 1 else next(it) for size in m.ranges)
        mask = E.op("eq", E.index(sympy.Mod(last, step)), E.index(0))
        return own, mask

    def _place_by_flow(self) -> None:
        """Place the members the rules above could not by the data flow: a member read by a
        placed one at an index that puts each of its dims on one kernel variable of that size
        sits there, and so does one that reads a placed member that way. A softmax over a
        leading dim: the max and sum reduce over (r, x) while the space is (x, r), so their
        pointwise users are (r, x), which no positional rule sees."""
        kernel_vars = set(self.xv) | set(self.rv)
        changed = True
        while changed:
            changed = False
            for m in self.order:
                placed = self._subs(m)
                for ld in E.loads([m.body]):
                    n = self.members.get(ld.arg[0])
                    if n is None or E.load_indirect(ld):
                        continue
                    if placed is not None and n.name not in self.own and not n.is_reduction:
                        idx = tuple(self._simplify(sympy.sympify(e).xreplace(placed)) for e in ld.arg[1])
                        if self._fits(n, idx, kernel_vars):
                            self.own[n.name], changed = idx, True
                    elif placed is None and n.name in self.own and not m.is_reduction:
                        idx = self._invert(m, ld.arg[1], self.own[n.name])
                        if idx is not None and self._fits(m, idx, kernel_vars):
                            self.own[m.name], changed, placed = idx, True, self._subs(m)

    def _subs(self, m: LoopNode) -> dict[sympy.Symbol, sympy.Expr] | None:
        """``m``'s variables in kernel variables, when ``m`` is placed."""
        if m.name not in self.own:
            return None
        return dict(zip(variables("i", len(m.ranges)), self.own[m.name])) | self.red_vars.get(m.name, {})

    def _fits(self, m: LoopNode, idx: tuple[sympy.Expr, ...], kernel_vars: set) -> bool:
        """Whether ``idx`` puts every dim of ``m`` on its own kernel variable of that size (unit
        dims at 0), covering the outer space or the whole one: a place to store it from."""
        if len(idx) != len(m.ranges):
            return False
        used = []
        for e, size in zip(idx, m.ranges):
            if size == 1:
                if e != 0:
                    return False
            elif e not in kernel_vars or not same(self.var_ranges[e], size):
                return False
            else:
                used.append(e)
        return len(set(used)) == len(used) and set(used) in (set(self.xv), set(self.xv) | set(self.rv))

    def _invert(self, m: LoopNode, index: tuple, place: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...] | None:
        """``m``'s place when it reads a member placed at ``place`` at ``index`` (``m``'s own
        variables, one per dim, or constants on unit dims)."""
        ivars = variables("i", len(m.ranges))
        found: dict[sympy.Symbol, sympy.Expr] = {}
        for e, p in zip(index, place):
            e = sympy.sympify(e)
            if e in ivars:
                found[e] = p
            elif not e.is_number:
                return None
        # dims the read does not reveal (a broadcast: x - mean(x, 0)) take the kernel
        # variables left, when their sizes pair them one way only; a wrong pairing could not
        # pass the check that reductions are read at their own row anyway
        left = [v for v in list(self.xv) + list(self.rv) if v not in found.values()]
        for v, size in zip(ivars, m.ranges):
            if v in found or size == 1:
                continue
            fits = [k for k in left if same(self.var_ranges[k], size)]
            if len(fits) != 1 or sum(same(sz, size) for u, sz in zip(ivars, m.ranges) if u not in found) != 1:
                return None
            found[v] = fits[0]
            left.remove(fits[0])
        return tuple(found.get(v, sympy.Integer(0)) for v in ivars)

    def _simplify(self, e: sympy.Expr) -> sympy.Expr:
        return simplify(e, self.var_ranges)

    # -- values ---------------------------------------------------------------------------------
    def value(self, name: str, index: tuple[sympy.Expr, ...]) -> E.Node:
        """Member ``name``'s value at ``index`` (kernel variables)."""
        index = tuple(self._simplify(sympy.sympify(i)) for i in index)
        key = (name, index)
        if key in self.memo:
            return self.memo[key]
        m = self.members.get(name) or self.inline[name]
        ivars = variables("i", len(m.ranges))
        if m.is_reduction:
            own = self.own[name]
            if any(not same(a, b) for a, b, s in zip(index, own, m.ranges) if s != 1):
                where = "element" if m.is_scan else "row"
                raise FusionError(f"a member reads {'scan' if m.is_scan else 'reduction'} {name} outside its own {where}")
            subs = dict(zip(ivars, own)) | self.red_vars[name]
        else:
            subs = dict(zip(ivars, index))
        body = E.substitute_vars([m.body], subs, self._simplify)[0]
        out = self.resolve(body)
        self.memo[key] = out
        return out

    def resolve(self, node: E.Node) -> E.Node:
        """Replace loads of members by their values."""
        def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
            if n.op != "load" or (n.arg[0] not in self.members and n.arg[0] not in self.inline):
                return None
            if E.load_indirect(n):
                raise FusionError(f"a gather reads {n.arg[0]} through data: it must be in memory")
            m = self.members.get(n.arg[0])
            if m is not None and m.scatter is not None:
                raise FusionError(f"{n.arg[0]} is a scatter's result, complete only when its kernel ends")
            v = self.value(n.arg[0], n.arg[1])
            mask = src[0] if n.arg[2] else None
            # the consumer's mask guards its own element, not the rows a reduction inside v
            # sums (a cat's branch mask is over r lanes: pushed into the sum, it drops part of
            # the row), and a reduction is read at its own row only (checked in ``value``)
            return v if mask is None else E.where(mask, _masked(v, mask, reductions=False), E.const(0, v.dtype))
        return E.rewrite([node], fn)[0]

    # -- the kernel -----------------------------------------------------------------------------
    def build(self) -> BuiltKernel:
        stores: list[tuple] = []
        for m in self.stored:
            own = self.own.get(m.name)
            if own is None:
                raise FusionError(f"{m.name} cannot be stored from this kernel")
            if m.scatter is None:
                stores.append((m.name, own, E.cast(self.value(m.name, own), m.dtype)))
                continue
            # a scatter: its values and indices at its own element, written where they point
            subs = dict(zip(variables("i", len(m.ranges)), own))
            body = E.substitute_vars([m.body, *m.scatter.indirect], subs, self._simplify)
            value, *indirect = (self.resolve(b) for b in body)
            index = tuple(self._simplify(sympy.sympify(e).xreplace(subs)) for e in m.scatter.index)
            stores.append((m.name, index, E.cast(value, m.dtype),
                           (tuple(indirect), m.scatter.accumulate, m.scatter.target)))
        _refuse_reads_of_scatter_targets(stores)
        return _canonical(self.x, self.r, stores, self.members, self.metas, self.store_masks)


def _refuse_reads_of_scatter_targets(stores: list[tuple]) -> None:
    """A kernel that scatters into a buffer must not read it: its lanes run in no set order,
    so a lane can read an element another lane has already scattered into (``y[x] += y[x]``
    with a repeated index read the sum of a duplicate, not eager's old value). No index is
    proven conflict-free here, so the read goes to a kernel of its own that runs first.

    Raises:
        FusionError: a value, index or mask of the kernel loads a scatter's target."""
    targets = {st[3][2] for st in stores if len(st) > 3}
    if not targets:
        return
    roots = [st[2] for st in stores] + [v for st in stores if len(st) > 3 for v in st[3][0]]
    for n in E.toposort(roots):
        if n.op == "load" and n.arg[0] in targets:
            raise FusionError(f"the kernel scatters into {n.arg[0]} and reads it: a lane could read an element "
                              "another lane already wrote")


def _masked(v: E.Node, mask: E.Node, reductions: bool = True) -> E.Node:
    """``v`` with every load inside it masked by ``mask`` too (no read where it is false);
    with ``reductions=False`` the loads under a reduction are left as they are (the mask does
    not say which elements the reduction combines)."""
    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op == "reduce" and not reductions:
            return n  # its operands unmasked: the rewritten (masked) ones are dropped
        if n.op == "checked":  # checked only where its loads read (elsewhere they read 0)
            own = E.checked_mask(n)
            both = mask if own is None else E.op("logical_and", src[2], mask)
            return E.Node("checked", n.dtype, (src[0], src[1], both))
        if n.op != "load":
            return None
        own = src[0] if n.arg[2] else None
        both = mask if own is None else E.op("logical_and", own, mask)
        return E.load(n.arg[0], n.arg[1], n.dtype, both, E.load_indirect(E.Node(n.op, n.dtype, src, n.arg)))
    return E.rewrite([v], fn)[0]


def _canonical(x, r, stores, members, metas: dict[str, TensorMeta],
               masks: dict[str, E.Node] | None = None) -> BuiltKernel:
    """Rename buffers to in{k}/out{k} and size symbols to z{k}, in order of appearance.
    ``stores`` are (name, index, value) or, for a scatter, (name, index, value, (indirect,
    accumulate, target)): its target is an input the output starts as. ``masks``: the store
    masks of values stored at some lanes only (index expressions, no loads)."""
    masks = masks or {}
    scatter = {st[0]: st[3] for st in stores if len(st) > 3}
    stores = [st[:3] for st in stores]
    values = [v for _, _, v in stores]
    indirect = [v for extra in scatter.values() for v in extra[0]]
    ext: list[str] = []
    for ld in E.toposort(values + indirect):
        if ld.op == "load" and ld.arg[0] not in ext:
            ext.append(ld.arg[0])
    for _, _, target in scatter.values():
        if target not in ext:
            ext.append(target)
    sym_order: list[sympy.Symbol] = []

    def note(e: Any) -> None:
        for s in sorted(sympy.sympify(e).free_symbols, key=lambda s: s.name):
            if is_iter_var(s):
                continue
            if s not in sym_order:
                sym_order.append(s)

    for e in tuple(x) + tuple(r):
        note(e)
    for name in ext:
        for e in metas[name].shape + metas[name].stride:
            note(e)
    for name, idx, _ in stores:
        for e in metas[name].shape + metas[name].stride:
            note(e)
    for e in E.free_index_symbols(values + indirect):
        note(e)
    for _, idx, _ in stores:
        for e in idx:
            note(e)
    zmap = {s: size_symbol(k) for k, s in enumerate(sym_order)}
    rename = {name: f"in{k}" for k, name in enumerate(ext)}
    rename.update({name: f"out{k}" for k, (name, _, _) in enumerate(stores)})

    def z(e: Any) -> sympy.Expr:
        return sympy.sympify(e).xreplace(zmap)

    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op == "load":
            return E.Node("load", n.dtype, src, (rename[n.arg[0]], tuple(z(i) for i in n.arg[1]), n.arg[2]))
        if n.op == "index":
            return E.Node("index", n.dtype, src, z(n.arg))
        return None

    new_values = E.rewrite(values, fn)
    extents = dict(zip(variables("x", len(x)), x)) | dict(zip(variables("r", len(r)), r))
    bounds = _index_bounds(values + indirect, metas, scatter, {n: idx for n, idx, _ in stores},
                           {k: sympy.sympify(n) for k, n in extents.items()})

    def buffer(name: str) -> Buffer:
        meta = metas[name]
        b = bounds.get(name)
        init = rename[scatter[name][2]] if name in scatter else None
        return Buffer(rename[name], dtypes.name_of(meta.dtype), tuple(z(s) for s in meta.shape),
                      tuple(z(s) for s in meta.stride), tuple(_bound(z(sympy.sympify(e))) for e in b) if b is not None else None, init)

    def store(n: str, idx: tuple, v: E.Node) -> Store:
        if n not in scatter:
            mask = E.rewrite([masks[n]], fn)[0] if n in masks else None
            return Store(rename[n], tuple(z(i) for i in idx), v, mask)
        ind, accumulate, _ = scatter[n]
        return Store(rename[n], tuple(z(i) for i in idx), v, None, tuple(E.rewrite(list(ind), fn)), accumulate)

    kernel = LoopKernel(tuple(z(s) for s in x), tuple(z(s) for s in r),
                        tuple(buffer(n) for n in ext), tuple(buffer(n) for n, _, _ in stores),
                        tuple(store(n, idx, v) for (n, idx, _), v in zip(stores, new_values)))
    return BuiltKernel(kernel, ext, [n for n, _, _ in stores], sym_order)


def build_kernel(members: list[LoopNode], stored: set[str], metas: dict[str, TensorMeta],
                 inline: dict[str, LoopNode] | None = None) -> BuiltKernel:
    """The loop kernel computing ``members`` and storing those named in ``stored``.

    Args:
        members: loop nodes, in graph order.
        stored: members whose values leave the kernel.
        metas: shape/stride/dtype of every value involved (members and what they read).
        inline: pointwise nodes outside the group that the kernel recomputes wherever it reads
            them (ones that read no memory: constants, iotas), instead of loading them.

    Raises:
        FusionError: the members cannot share one kernel.
    """
    try:
        return _Builder(members, stored, metas, inline).build()
    except FusionError as first:
        # the positional places may be wrong where sizes repeat (a softmax over dim 0 of a
        # square tensor: (x, r) and (r, x) both fit); the data flow's places are right
        if not any(m.is_reduction for m in members):
            raise
        try:
            return _Builder(members, stored, metas, inline, by_flow=True).build()
        except FusionError:
            raise first from None




__all__ = ["BuiltKernel", "FusionError", "build_kernel"]

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
from typing import Any, Callable

import sympy

from tilewright.compiler.graph import LoopNode, TensorMeta
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import (
    group_index, is_iter_var, product, refine, same, simplify, static_numel, subsampling, unravel, variables,
)
from tilewright.ir.kernel import Buffer, LoopKernel, Store, size_symbol


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
        elif dtypes.is_float(x.dtype):
            ident = float("-inf") if kind in ("max", "argmax") else float("inf")
        elif x.dtype == "bool":
            ident = kind in ("min", "argmin")
        else:
            info = __import__("torch").iinfo(dtypes.TORCH[x.dtype])
            ident = info.min if kind in ("max", "argmax") else info.max
        return E.Node("reduce", n.dtype, (E.where(mask, x, E.const(ident, x.dtype)),), kind)
    return E.rewrite([v], fn)[0]


def _varies_along(v: E.Node, var: sympy.Symbol) -> bool:
    """Whether ``v`` varies with ``var`` outside its reductions (a scan varies)."""
    for n in E.toposort([v], stop=lambda n: n.op == "reduce"):
        if n.op == "scan" or n.op == "load" and any(var in sympy.sympify(e).free_symbols for e in n.arg[1]) \
                or n.op == "index" and var in n.arg.free_symbols:
            return True
    return False


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
    bounds = _index_bounds(values + indirect, metas, scatter, {n: idx for n, idx, _ in stores})

    def buffer(name: str) -> Buffer:
        meta = metas[name]
        b = bounds.get(name)
        init = rename[scatter[name][2]] if name in scatter else None
        return Buffer(rename[name], dtypes.name_of(meta.dtype), tuple(z(s) for s in meta.shape),
                      tuple(z(s) for s in meta.stride), (0, _bound(z(b))) if b is not None else None, init)

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


def _bound(e: sympy.Expr) -> Any:
    """A bound as an int when it is one, else the expression of size symbols."""
    return int(e) if not e.free_symbols else e


def _index_bounds(values: list[E.Node], metas: dict[str, TensorMeta], scatter: dict | None = None,
                  store_index: dict | None = None) -> dict[str, sympy.Expr]:
    """Integer buffers whose values index a gather or a scatter: the size of the dim they index
    (tuning draws their random values below it), an expression of the graph's size symbols
    when that dim is dynamic, so a bucket's inputs fit its own tables; a ``checked`` index's
    bound (a view's extent, a one-hot scatter's dim) too, wherever it is used."""
    out: dict[str, sympy.Expr] = {}

    def bound_loads(v: E.Node, size: sympy.Expr) -> None:
        affine = _affine_in_one_load(_unwrapped(v))
        for ld in E.toposort([v]):
            if ld.op == "load":
                bound = size
                if affine is not None and affine[0] == ld.arg[0]:
                    # index = a*value + b, a > 0, b >= 0: values in [0, bound) keep it below size
                    _, a, b = affine
                    bound = sympy.Max(1, sympy.floor((size - 1 - b) / a) + 1)
                prev = out.get(ld.arg[0])
                out[ld.arg[0]] = bound if prev is None else sympy.Min(prev, bound)

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
    return out


def _unwrapped(v: E.Node) -> E.Node:
    """An index value without the negative-index wrap the lowering puts around it
    (``where(v < 0, v + size, v)``): the values tuning draws are non-negative."""
    if v.op == "where" and v.src[0].op == "lt" and v.src[0].src[0] == v.src[2]:
        return v.src[2]
    return v


def _affine_in_one_load(v: E.Node) -> tuple[str, int, int] | None:
    """``(buffer, a, b)`` where index value ``v`` is ``a * load(buffer) + b`` with integers
    ``a > 0`` and ``b >= 0`` (``w[i + 2]``, ``w[2 * i]``), else None: an index of any other form
    keeps the bound of the dim's size."""
    def walk(n: E.Node) -> sympy.Expr | None:
        if n.op == "load":
            return sympy.Symbol(n.arg[0])
        if n.op == "const" and isinstance(n.arg, int) and not isinstance(n.arg, bool):
            return sympy.Integer(n.arg)
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
    if e is None or len(e.free_symbols) != 1:
        return None
    (x,) = e.free_symbols
    poly = sympy.Poly(e, x)
    if poly.degree() != 1:
        return None
    a, b = (int(c) for c in poly.all_coeffs())
    return (x.name, a, b) if a > 0 and b >= 0 else None


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




def _rows(n: sympy.Expr, r: sympy.Expr) -> sympy.Expr:
    """ceil(n / r): rows of length ``r`` that hold ``n`` elements."""
    if n.is_Integer and r.is_Integer:
        return sympy.Integer(-(-int(n) // int(r)))
    return sympy.floor((n + r - 1) / r)


def _lt(a: sympy.Expr, b: sympy.Expr) -> E.Node:
    return E.op("lt", E.index(a), E.index(b))


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
            inputs.setdefault(rename[b.name], buf(b))
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


__all__ = ["BuiltKernel", "FusionError", "build_kernel", "combine"]

"""C++ templates for loop kernels (:class:`~tilewright.problem.LoopProblem`) on the ``cpu``
target: scalar C++ per element that g++ vectorises (``#pragma omp simd``), OpenMP threads over
rows, built and cached by :mod:`tilewright.templates.cpp.runtime`.

Pointwise (``cpp.pointwise``): the iteration space as rows (every dim but the last) times the
last dim, cut into tasks of ``BLOCK`` elements of one row; threads take tasks, each task one
vectorised loop along the last dim (one per piece of a cat or a pad along it: :mod:`.segments`). Values that do not vary along it are computed once per task.

Reduction (``cpp.reduction``): threads take rows (output points). Each level of dependent
reductions (softmax's max, then the sum of ``exp(x - max)``) is one pass over the row, each
reduction held in ``LANES`` partial accumulators that the pass updates ``LANES`` elements at a
time (one vector operation per step, no dependency between lanes), combined at the end of the
pass: sums and products in order of lanes; max/min propagate NaN; argmax/argmin keep each
lane's first extreme and then the smallest index holding the row's (NaN largest, as torch);
Welford mean/M2 per lane merged with Chan's formula. Values stored per element take one pass
more; values stored per row are written after the passes. ``PERSISTENT`` keeps the values a
later pass needs in a row buffer per thread (softmax's ``exp``, computed once; a value as cheap
to load again, a plain load, is loaded again), and computes mean and M2 exactly in two passes
over the buffered row; the looped form recomputes them from memory instead, for rows too long
to buffer. The knob changes the source (a build each); the block size is a run-time argument.
``ORDER="outer"`` (:mod:`.outer`) loops r outermost and a vectorised loop over a block of x
inside, for reductions over the outer dims of a row-major tensor (a norm's weight gradient):
offered beside the row order where the traced layout reads x contiguously, both timed.

Combo kernels run their parts one after another, each part in its own space (no masked lanes).
Loads and stores index buffers through run-time strides (in elements), so any layout is read
correctly, and the traced layout runs a specialised instance (:mod:`.source`); index
arithmetic is 64-bit. Gathers check their index against the dim it selects
(``IndexError``, as torch) and integer division by zero is reported (``ZeroDivisionError``),
neither ever touches memory out of bounds or traps. Refused: fp8 buffers and GEMM accumulators.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.bounds import var_ranges
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask, toposort
from tilewright.ir.index import code as py_code
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.c_expr import reduction_identity
from tilewright.templates.c_loops import CFamilyBody, loop_support
from tilewright.templates.cpp.outer import outer_refusal
from tilewright.templates.cpp.emit import CTYPE, STORAGE, CppExpr, ccode, literal
from tilewright.templates.cpp.rowops import CppRowOps, scatter_plan
from tilewright.templates.cpp.segments import fold, split_points
from tilewright.templates.cpp.source import LANES, source_context

PERSISTENT_MAX_ROW = 1 << 16  # elements of a row a thread may buffer (per buffered value)
LOOPED_MIN_ROW = 8192  # rows at least this long also get the looped candidate


def _identity(kind: str, ct: str) -> str:
    return reduction_identity(kind, ct, literal, _int_limit, "C++")


def _int_limit(ct: str, low: bool) -> str:
    bits = 8 * dtypes.ITEMSIZE[ct]
    if ct == "u8":
        return literal(0 if low else 255, ct)
    return literal(-(2 ** (bits - 1)) if low else 2 ** (bits - 1) - 1, ct)

def _two_pass_welford(kernel: LoopKernel) -> dict[Node, Node]:
    """Welford mean and M2 rewritten as their exact two-pass form (``sum(x) / n``, then
    ``sum((x - mean)²)``), for kernels that hold the row: root -> rewritten root."""
    n_r = kernel.rnumel

    def fn(n: Node, src: tuple[Node, ...]) -> Node | None:
        if n.op != "reduce" or n.arg not in ("welford_mean", "welford_m2"):
            return None
        x = src[0]
        mean = E.op("truediv", E.reduce("sum", x), E.cast(E.index(n_r, "i64"), x.dtype))
        if n.arg == "welford_mean":
            return E.cast(mean, n.dtype) if n.dtype != x.dtype else mean
        d = x - mean
        m2 = E.reduce("sum", d * d)
        return E.cast(m2, n.dtype) if n.dtype != x.dtype else m2

    roots = kernel.roots()
    return dict(zip(roots, E.rewrite(roots, fn)))


def _reciprocal_outside(roots: list[Node], inner) -> list[Node]:
    """``a / b`` where ``a`` varies along a row and ``b`` is a value of the row (a reduction's,
    not a constant) as ``a * (1 / b)``, the reciprocal computed once per row: a division costs
    ~30 multiplies per vector, and eager's softmax scales by the reciprocal too (within an ulp of
    dividing; softmax rows 15% faster, measured)."""
    vs = set(inner)
    varies: dict[Node, bool] = {}
    for n in toposort(roots):
        if n.op == "reduce":
            varies[n] = False
        elif n.op == "scan":  # a prefix varies along its row, even of a value that does not
            varies[n] = True
        elif n.op == "load":
            varies[n] = any(i.free_symbols & vs for i in n.arg[1]) or any(varies[x] for x in n.src)
        elif n.op == "index":
            varies[n] = bool(n.arg.free_symbols & vs)
        else:
            varies[n] = any(varies[x] for x in n.src)

    def fn(n: Node, src: tuple[Node, ...]) -> Node | None:
        if n.op == "truediv" and dtypes.is_float(n.dtype) and varies[n.src[0]] and not varies[n.src[1]] \
                and n.src[1].op != "const":
            return E.op("mul", src[0], E.op("reciprocal", src[1]))
        return None

    return E.rewrite(roots, fn)


def _rewritten(kernel: LoopKernel, persistent: bool) -> LoopKernel:
    """``kernel`` with this language's rewrites: Welford as two exact passes where the row is
    buffered, a row's divisions by a reduced value as one reciprocal (reductions only)."""
    if kernel.kind != "reduction":
        return kernel
    roots = kernel.roots()
    rewrite = _two_pass_welford(kernel) if persistent else {r: r for r in roots}
    new = _reciprocal_outside([rewrite[r] for r in roots], kernel.r_vars)
    values = iter(new)
    stores = [dataclasses.replace(s, value=next(values)) for s in kernel.stores]
    stores = [dataclasses.replace(s, mask=next(values)) if s.mask is not None else s for s in stores]
    return dataclasses.replace(kernel, stores=tuple(stores))


class _Body(CppRowOps, CFamilyBody):
    """The loop schedule (:class:`~tilewright.templates.loop_schedule.LoopSchedule`) in C++ for
    the host CPU, on a kernel :func:`_rewritten` for it.

    Pointwise: rows (every dim but the last) times a vectorised loop along the last dim over a
    task's ``[tw_lo, tw_hi)`` (:meth:`pointwise`: the schedule's flat index would cost a 64-bit
    division per element, which no vector unit has). Looped rows: the schedule's passes, each
    pass's row loop run ``LANES`` elements per step (one vector operation on each reduction's
    lane array), then its ragged tail, the body written once and placed in both loops
    (:meth:`close_row_loop`). ``buffered`` (the template's ``PERSISTENT``): values a later pass
    reads are written to a row buffer per thread by the pass that computes them and read back
    by the later ones (:meth:`_plan_buffers`). Scans and scatters: :mod:`.rowops` (a loop that
    computes a scan, or scatters along a variable that is not a target coordinate, runs in
    order: no ``#pragma omp simd``)."""

    floordiv = "/"

    def __init__(self, kernel: LoopKernel, buffered: bool = False):
        self.buffered = buffered and kernel.kind == "reduction"
        self.welford: dict[int, tuple[str, str]] = {}  # value -> (mean, M2) of its combine
        self.caches: list[tuple[str, str]] = []  # (row buffer, C type) a thread allocates
        self.cached: dict[Node, tuple[str, int]] = {}  # value -> (its row buffer, its pass)
        self.pass_index = 0
        self.lanes_open = False  # the row loop being written updates lane arrays
        self.in_order = False  # the row loop being written computes a scan: no simd
        self.scan_buffers: dict[Node, str] = {}  # sums computed in passes of their own (rowops.py)
        super().__init__(_rewritten(kernel, self.buffered))
        self.plan = scatter_plan(self.k)
        self.nodes = toposort(self.k.roots())
        self.dep_r = self._depends(self.rvars)
        self.ranges = var_ranges(self.k)
        self.gathers = any(n.op == "checked" or n.op == "load" and load_indirect(n) for n in self.nodes)
        self.short_row = self.k.rnumel.is_Integer and int(self.k.rnumel) < LANES
        if self.buffered:
            self._plan_buffers()

    def ccode(self, e: Any, names: dict) -> str:
        return ccode(e, names)

    def extents(self) -> dict:
        return self.ranges  # computed once, in __init__

    def make_emitter(self) -> CppExpr:
        e = CppExpr(load=self._load, index=self._index, reduce=self.reduce_inline, scan=self.scan_value,
                    indent="    ")
        e.checked = self._checked
        return e

    def _depends(self, vars_) -> dict[Node, bool]:
        """Whether each node varies along ``vars_`` (a reduction's result does not)."""
        vs, memo = set(vars_), {}
        for n in self.nodes:
            if n.op == "reduce":
                memo[n] = False
            elif n.op == "scan":  # a prefix varies along its row (scans are row ops)
                memo[n] = True
            elif n.op == "load":
                memo[n] = any(i.free_symbols & vs for i in n.arg[1]) or any(memo[s] for s in n.src)
            elif n.op == "index":
                memo[n] = bool(n.arg.free_symbols & vs)
            else:
                memo[n] = any(memo[s] for s in n.src)
        return memo

    # -- values -----------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        names = dict(self.names)
        own = load_mask(n)
        for k, v in enumerate(load_indirect(n)):
            value = f"int64_t({self.e.names[v]})"
            if own is not None:  # a masked-off lane's index may be anything: it reads nothing
                value = f"({self.e.names[own]} ? {value} : int64_t(0))"
            names[indirect_symbol(k)] = value
        idx = list(idx)
        # gathered dims: checked against their dim, not read out of it (unless proven in range)
        self.check_gathered(n, buf, idx, names)
        return self.read(n, buf, idx, names, own)

    def hoist(self, roots: list[Node], depends: dict[Node, bool]) -> None:
        """Emit now the values ``roots`` read that do not vary in the loop about to open."""
        names = self.e.names
        for n in toposort(roots, stop=lambda n: n in names or not depends[n]):
            if n not in names and not depends[n] and n.op != "const":
                self.e.emit(n)

    def write_store(self, s, buf, node: Node, value: str, guard: str | None) -> None:
        if s.is_scatter:
            self.write_scatter(s, buf, node, value)
            return
        super().write_store(s, buf, node, value, guard)

    def pointwise(self) -> None:
        """Inside a task: the row's variables, its invariant values, then the vectorised loop
        along the last dim over ``[tw_lo, tw_hi)``; one loop per segment where a cat's or a
        pad's pieces meet at static points along it, each with its masks folded (:mod:`.segments`)."""
        k = self.k
        inner = self.xvars[-1:]
        if len(k.ranges) > 1:
            self.decompose("tw_row", self.xvars[:-1], k.ranges[:-1])
        self.hoist(k.roots(), self._depends(inner))
        points, cmps = split_points(k.roots(), inner[0], k.ranges[-1]) if inner and not k.scatters() else ([], {})
        if not points:
            self._row_loop("tw_lo", "tw_hi", k.stores)
            return
        # a cat's or a pad's pieces along the row: a loop per segment, its masks folded (segments.py)
        for i, lo in enumerate([0] + points):
            stores = []
            for s in k.stores:
                value, *mask = fold([s.value] + ([s.mask] if s.mask is not None else []), cmps, lo)
                if mask and mask[0].op == "const":
                    if not mask[0].arg:
                        continue  # not this store's share of the space
                    mask = []
                stores.append(dataclasses.replace(s, value=value, mask=mask[0] if mask else None))
            self._row_loop("tw_lo" if i == 0 else f"tw_max(tw_lo, {lo}L)",
                           "tw_hi" if i == len(points) else f"tw_min(tw_hi, {points[i]}L)", stores)

    def _row_loop(self, lo: str, hi: str, stores) -> None:
        """The vectorised loop over a task's columns ``[lo, hi)`` storing ``stores``."""
        inner = self.xvars[-1:]
        # not vectorised where a scatter may hit one element twice along the row: in order
        self.open_checked_loop(self.plan.inner_parallel)
        self.e.line(f"for (int64_t tw_col = {lo}; tw_col < {hi}; ++tw_col) {{")
        self.e.indent += "  "
        self.e.push()
        if inner:
            self.e.line(f"const int64_t {inner[0].name} = tw_col;")
        for s in stores:
            self.store(s, None)
        self.e.pop()
        self.e.indent = self.e.indent[:-2]
        self.e.line("}")
        self.close_checked_loop()

    def open_row_loop(self) -> tuple[str, str]:
        # a scan computed in this loop (not read back from an earlier pass's row buffer) needs
        # the row in order
        self.in_order = any(not (n in self.cached and self.cached[n][1] < self.pass_index) for n in self.carries)
        if not self.lanes_open:  # the per-element stores' pass: a plain vectorised loop
            final = [s for s in self.k.stores if self.on_r(s)]
            self.hoist([s.value for s in final] + [s.mask for s in final if s.mask is not None], self.dep_r)
            self.open_checked_loop(not self.in_order and self.plan.inner_parallel)
            self.e.line("for (int64_t rindex = 0; rindex < rnumel; ++rindex) {")
            self.e.indent += "  "
        else:  # the body is written once, then placed in the whole-step loop and in the tail
            self._outer = (self.e.lines, self.e.indent)
            self.e.lines, self.e.indent = [], ""
            self.e.line(f"const int64_t rindex = {self.rbase} + tw_l;")
        self.e.push()
        self.bind_row_values()  # earlier passes' values: buffered
        return "rindex", ""

    def close_row_loop(self) -> None:
        e = self.e
        for n, (name, computed_in) in self.cached.items():  # what later passes read back
            if computed_in == self.pass_index:
                e.line(f"{name}[rindex] = {e.emit(n)};")
        e.pop()
        if not self.lanes_open:
            e.indent = e.indent[:-2]
            e.line("}")
            self.close_checked_loop()
            return
        body, (e.lines, e.indent) = e.lines, self._outer
        e.line(f"int64_t {self.rbase} = 0;")
        e.line(f"for (; {self.rbase} + {LANES} <= rnumel; {self.rbase} += {LANES}) {{")
        if not self.in_order:
            e.line("  #pragma omp simd")
        e.line(f"  for (int64_t tw_l = 0; tw_l < {LANES}; ++tw_l) {{")
        for text in body:
            e.line("    " + text)
        e.line("  }")
        e.line("}")
        # a row known to be shorter than LANES is all tail, whose lanes are apart too: vectorised
        # (a router's softmax over 8 experts: 0.0020 -> 0.0015 ms). Not the tail of a longer row
        # (a strided column sum of 48: 10% slower), nor where the row gathers (a checked index
        # keeps the loop scalar; its simd form measured 18% slower)
        if not self.in_order and not self.gathers and self.short_row:
            e.line("#pragma omp simd")
        e.line(f"for (int64_t tw_l = 0; tw_l < rnumel - {self.rbase}; ++tw_l) {{")
        for text in body:
            e.line("  " + text)
        e.line("}")
        self.lanes_open = False
        self.pass_index += 1

    @property
    def rbase(self) -> str:
        return f"tw_rbase{self.pass_index}"

    # -- row buffers (PERSISTENT) -----------------------------------------------------------------
    def _cheap(self, n: Node) -> bool:
        """Values as cheap to compute again as to read from a row buffer."""
        if n.op == "load":
            return not n.src
        if n.op in ("index", "const") or self.vector_scan(n):  # a sum is in a row buffer already
            return True
        return n.op == "cast" and self._cheap(n.src[0])

    def _plan_buffers(self) -> None:
        """Which values one pass computes and a later pass reads: those get a row buffer."""
        k = self.k
        level: dict[Node, int] = {}
        for n in self.nodes:
            level[n] = max((level[s] for s in n.src), default=0) + (1 if n.is_reduce else 0)
        reduces = [n for n in self.nodes if n.is_reduce]
        passes = [[r.src[0] for r in reduces if level[r] == lv] for lv in sorted({level[r] for r in reduces})]
        final = [s for s in k.stores if self.on_r(s)]
        passes.append([s.value for s in final] + [s.mask for s in final if s.mask is not None])
        first: dict[Node, int] = {}
        for p, roots in enumerate(passes):
            seen = []
            for n in toposort(roots, stop=lambda n: not self.dep_r[n] or n in first):
                if not self.dep_r[n]:
                    continue
                if n in first:
                    if n not in self.cached:
                        name = f"tw_row{len(self.caches)}"
                        self.caches.append((name, CTYPE[dtypes.compute_type(n.dtype)]))
                        self.cached[n] = (name, first[n])
                    continue
                seen.append(n)
            for n in seen:
                if not self._cheap(n):
                    first.setdefault(n, p)

    # -- reductions: LANES partial accumulators a pass, combined after it -------------------------
    def init_accumulators(self, r: Node) -> list[str]:
        e = self.e
        self.hoist([r.src[0]], self.dep_r)
        self.lanes_open = True
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind in ("any", "all"):
            ct = "bool"
        c = CTYPE[ct]
        if kind.startswith("welford"):
            if not dtypes.is_float(ct):
                raise UnsupportedProblemError("Welford mean/variance of an integer value")
            accs = [e.fresh() for _ in range(3)]  # mean, m2, count
            e.line(f"{c} {accs[0]}[{LANES}], {accs[1]}[{LANES}], {accs[2]}[{LANES}];")
            e.line(f"for (int tw_l = 0; tw_l < {LANES}; ++tw_l) {{ {accs[0]}[tw_l] = {accs[1]}[tw_l] = "
                   f"{accs[2]}[tw_l] = {literal(0, ct)}; }}")
            return accs
        if kind in ("argmax", "argmin"):
            val, idx = e.fresh(), e.fresh()
            e.line(f"{c} {val}[{LANES}]; int64_t {idx}[{LANES}];")
            e.line(f"for (int tw_l = 0; tw_l < {LANES}; ++tw_l) {{ {val}[tw_l] = {_identity(kind, ct)}; "
                   f"{idx}[tw_l] = -1; }}")
            return [val, idx]
        acc = e.fresh()
        e.line(f"{c} {acc}[{LANES}];")
        e.line(f"for (int tw_l = 0; tw_l < {LANES}; ++tw_l) {acc}[tw_l] = {_identity(kind, ct)};")
        return [acc]

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        e = self.e
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind in ("any", "all"):
            ct = "bool"
        c = CTYPE[ct]
        if kind.startswith("welford"):
            mean, m2, w = (f"{a}[tw_l]" for a in accs)
            e.line(f"{w} += {c}(1); {{ const {c} tw_d = {v} - {mean}; {mean} += tw_d / {w}; "
                   f"{m2} += tw_d * ({v} - {mean}); }}")
        elif kind in ("argmax", "argmin"):
            val, idx = (f"{a}[tw_l]" for a in accs)
            better = ">" if kind == "argmax" else "<"
            nan = f" || ({v} != {v} && {val} == {val})" if dtypes.is_float(ct) else ""
            # rindex grows along a lane: a strictly better value (or the first NaN) takes over
            e.line(f"{{ const bool tw_t = {idx} < 0 || ({v} {better} {val}){nan}; "
                   f"{val} = tw_t ? {c}({v}) : {val}; {idx} = tw_t ? rindex : {idx}; }}")
        else:
            a = f"{accs[0]}[tw_l]"
            fn = {"sum": f"{c}({a} + {v})", "prod": f"{c}({a} * {v})",
                  "any": f"{a} || bool({v})", "all": f"{a} && bool({v})"}.get(kind)
            if fn is None:
                better = ">" if kind == "max" else "<"
                nan = f" || {v} != {v}" if dtypes.is_float(ct) else ""
                fn = f"({v} {better} {a}{nan}) ? {c}({v}) : {a}"
            e.line(f"{a} = {fn};")

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        e = self.e
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind in ("any", "all"):
            ct = "bool"
        c = CTYPE[ct]
        if kind.startswith("welford"):
            if owner:  # the lanes' (count, mean, M2) merged one by one (Chan et al.)
                mean, m2, w = accs
                tn, tm, ts = e.fresh(), e.fresh(), e.fresh()
                e.line(f"{c} {tn} = 0, {tm} = 0, {ts} = 0;")
                e.line(f"for (int tw_l = 0; tw_l < {LANES}; ++tw_l) {{")
                e.line(f"  if ({w}[tw_l] == 0) continue;")
                e.line(f"  const {c} tw_nn = {tn} + {w}[tw_l], tw_d = {mean}[tw_l] - {tm};")
                e.line(f"  {tm} += tw_d * ({w}[tw_l] / tw_nn);")
                e.line(f"  {ts} += {m2}[tw_l] + tw_d * tw_d * ({tn} * {w}[tw_l] / tw_nn);")
                e.line(f"  {tn} = tw_nn;")
                e.line("}")
                self.welford[id(r.src[0])] = (tm, ts)
            return self._as(self.welford[id(r.src[0])][0 if kind == "welford_mean" else 1], ct, r.dtype)
        out = e.fresh()
        if kind in ("argmax", "argmin"):
            val, idx = accs
            better = ">" if kind == "argmax" else "<"
            bv, bi = e.fresh(), e.fresh()
            e.line(f"{c} {bv} = {val}[0]; int64_t {bi} = {idx}[0];")
            if dtypes.is_float(ct):
                wins = f"({val}[tw_l] {better} {bv} || ({val}[tw_l] != {val}[tw_l] && {bv} == {bv}))"
                same = f"({val}[tw_l] == {bv} || ({val}[tw_l] != {val}[tw_l] && {bv} != {bv}))"
            else:
                wins, same = f"({val}[tw_l] {better} {bv})", f"({val}[tw_l] == {bv})"
            e.line(f"for (int tw_l = 1; tw_l < {LANES}; ++tw_l) {{")
            e.line(f"  if ({idx}[tw_l] >= 0 && ({bi} < 0 || {wins} || ({same} && {idx}[tw_l] < {bi}))) "
                   f"{{ {bv} = {val}[tw_l]; {bi} = {idx}[tw_l]; }}")
            e.line("}")
            e.line(f"const int64_t {out} = {bi} < 0 ? int64_t(0) : {bi};")
            return self._as(out, "i64", r.dtype)
        a = accs[0]
        e.line(f"{c} {out} = {a}[0];")
        fn = {"sum": f"{c}({out} + {a}[tw_l])", "prod": f"{c}({out} * {a}[tw_l])",
              "any": f"{out} || {a}[tw_l]", "all": f"{out} && {a}[tw_l]"}.get(kind)
        if fn is None:
            better = ">" if kind == "max" else "<"
            nan = f" || {a}[tw_l] != {a}[tw_l]" if dtypes.is_float(ct) else ""
            fn = f"({a}[tw_l] {better} {out}{nan}) ? {a}[tw_l] : {out}"
        e.line(f"for (int tw_l = 1; tw_l < {LANES}; ++tw_l) {out} = {fn};")
        return self._as(out, ct, r.dtype)

    def _as(self, name: str, held: str, dtype: str) -> str:
        """``name`` (held in compute type ``held``) as a value of the reduction's dtype."""
        ct = dtypes.compute_type(dtype)
        if ct == held:
            return name
        out = self.e.fresh()
        self.e.line(f"const {CTYPE[ct]} {out} = {self.e.convert(name, held, dtype)};")
        return out


class _CppLoops(TemplateSpec):
    backend = "cpp"
    jinja = "loops.py.jinja"
    # compiled code on the cpu target: the loop policy offers it there under auto
    # (kinds/loop/policy.py offered_on), timed against the ATen ops and the torch form
    compiled_on_cpu = True

    def problem_support(self, problem: Any, target: Target) -> Support:
        for st in problem.kernel.scatters() + [s for p in problem.kernel.parts for s in p.scatters()]:
            if st.accumulate not in (None, "add", "max", "min"):
                return Support(False, f"C++ scatters do not combine by {st.accumulate!r}")
        # scans and scatters: templates/cpp/rowops.py
        return loop_support(self, problem, target, backend="cpu", kernels="C++ loop kernels",
                            language="C++", storage=STORAGE, scans_and_scatters=True)

    def render_kernel(self, problem: LoopProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        k = problem.kernel
        names = {s: s.name for s in k.size_symbols()}
        source = self.render_jinja(
            problem_text=problem.describe().replace("\n", "\n# "), params_text=self.space.encode(params),
            target=target.name, name=f"cpp_{problem.kind}",
            inputs=[b.name for b in k.inputs], sizes=[s.name for s in k.size_symbols()],
            outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]), "init": b.init,
                      "shape": [py_code(s, names) for s in b.shape],
                      "stride": [py_code(s, names) for s in b.stride]} for b in k.outputs],
            block=int(params.get("BLOCK", 4096)), op=(problem.op or problem.kind).replace('"', "'"),
            **source_context(k, bool(params.get("PERSISTENT", False)), params.get("ORDER", "row")))
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=f"cpp_{problem.kind}", meta={"kind": problem.kind, "language": "cpp"})


class CppPointwise(_CppLoops):
    """Pointwise kernels: tasks of ``BLOCK`` elements along the last dim, one vector loop each."""

    id = "cpp.pointwise"
    op = "pointwise"
    space = ParamSpace((Knob("BLOCK", (256, 1024, 4096, 16384, 65536), 4096,
                             "elements of one row per task (threads take tasks)"),))

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        return [{"BLOCK": 4096}, {"BLOCK": 65536}]


class CppReduction(_CppLoops):
    """Reduction kernels: threads take rows; each pass over a row in ``LANES`` accumulators."""

    id = "cpp.reduction"
    op = "reduction"
    space = ParamSpace((Knob("PERSISTENT", (False, True), True,
                             "buffer the values later passes read in a row buffer per thread"),
                        Knob("ORDER", ("row", "outer"), "row",
                             "row: x outermost, each row reduced in lanes; outer: r outermost, a "
                             "vectorised loop over a block of x inside (templates/cpp/outer.py)")))

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        if (why := self.space_refusal(params)) is not None:
            return why
        if self.space.complete(params)["ORDER"] == "outer":
            return outer_refusal(problem.kernel)  # PERSISTENT: nothing to buffer, ignored
        if self.space.complete(params)["PERSISTENT"] and problem.rnumel > PERSISTENT_MAX_ROW:
            return f"a row of {problem.rnumel} is too long to buffer (PERSISTENT=False loops over it)"
        return None

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        """The persistent form where the row fits, the looped one for long rows (each one
        build: the knob changes the source)."""
        out = [{"PERSISTENT": True}] if problem.rnumel <= PERSISTENT_MAX_ROW else []
        out += [{"PERSISTENT": False}] if problem.rnumel >= LOOPED_MIN_ROW or not out else []
        if outer_refusal(problem.kernel) is None:  # x contiguous, r strided: both orders timed
            out.append({"PERSISTENT": False, "ORDER": "outer"})
        return out

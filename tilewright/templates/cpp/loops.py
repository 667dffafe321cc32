"""C++ templates for loop kernels (:class:`~tilewright.problem.LoopProblem`) on the ``cpu``
target: scalar C++ per element that g++ vectorises (``#pragma omp simd``), OpenMP threads over
rows, built and cached by :mod:`tilewright.runtime.cpp`.

Pointwise (``cpp.pointwise``): the iteration space as rows (every dim but the last) times the
last dim, cut into tasks of ``BLOCK`` elements of one row; threads take tasks, each task one
vectorised loop along the last dim. Values that do not vary along it are computed once per task.

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

Combo kernels run their parts one after another, each part in its own space (no masked lanes).
Loads and stores index buffers through run-time strides (in elements), so any layout is read
correctly, and the traced layout runs a specialised instance (:mod:`.source`); index
arithmetic is 64-bit. Gathers check their index against the dim it selects
(``IndexError``, as torch) and integer division by zero is reported (``ZeroDivisionError``),
neither ever touches memory out of bounds or traps. Refused: fp8 buffers and GEMM accumulators.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask, toposort
from tilewright.ir.index import offset, unflatten
from tilewright.ir.index import code as py_code
from tilewright.ir.kernel import LoopKernel, Store
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.cpp.emit import CTYPE, STORAGE, CppExpr, ccode, literal
from tilewright.templates.cpp.source import LANES, source_context

PERSISTENT_MAX_ROW = 1 << 16  # elements of a row a thread may buffer (per buffered value)
LOOPED_MIN_ROW = 8192  # rows at least this long also get the looped candidate


def _identity(kind: str, ct: str) -> str:
    if kind in ("sum", "welford_mean", "welford_m2"):
        return literal(0, ct)
    if kind == "prod":
        return literal(1, ct)
    if kind in ("max", "argmax"):
        return literal(float("-inf"), ct) if dtypes.is_float(ct) else _int_limit(ct, low=True)
    if kind in ("min", "argmin"):
        return literal(float("inf"), ct) if dtypes.is_float(ct) else _int_limit(ct, low=False)
    if kind == "any":
        return "false"
    if kind == "all":
        return "true"
    raise UnsupportedProblemError(f"C++ reductions do not know {kind!r}")


def _int_limit(ct: str, low: bool) -> str:
    if ct == "bool":
        return "false" if low else "true"
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


class _Body:
    """The C++ body of one loop kernel (or one part of a combo kernel): variables, loads,
    stores, reductions; ``persistent`` buffers the values later passes read."""

    def __init__(self, kernel: LoopKernel, persistent: bool = False):
        self.k = kernel
        self.reduction = kernel.kind == "reduction"
        self.xvars, self.rvars = kernel.x_vars, kernel.r_vars
        self.names = {s: s.name for s in kernel.size_symbols()}
        self.e = CppExpr(load=self._load, index=self._index, reduce=self._unbound_reduction, indent="    ")
        self.persistent = persistent and self.reduction
        rewrite = _two_pass_welford(kernel) if self.persistent else {r: r for r in kernel.roots()}
        if self.reduction:
            rewrite = dict(zip(rewrite, _reciprocal_outside(list(rewrite.values()), self.rvars)))
        self.value = {id(s): rewrite.get(s.value, s.value) for s in kernel.stores}
        self.mask = {id(s): rewrite.get(s.mask, s.mask) if s.mask is not None else None for s in kernel.stores}
        roots = list(self.value.values()) + [m for m in self.mask.values() if m is not None]
        self.nodes = toposort(roots)
        self.dep_r = self._depends(self.rvars)
        self.caches: list[tuple[str, str]] = []  # (array name, C type) of the persistent row buffers
        self.cached: dict[Node, tuple[str, int]] = {}  # value -> (its row buffer, the pass computing it)
        self.pass_index = 0

    def _depends(self, vars_) -> dict[Node, bool]:
        """Whether each node varies along ``vars_`` (a reduction's result does not)."""
        vs, memo = set(vars_), {}
        for n in self.nodes:
            if n.op == "reduce":
                memo[n] = False
            elif n.op == "load":
                memo[n] = any(i.free_symbols & vs for i in n.arg[1]) or any(memo[s] for s in n.src)
            elif n.op == "index":
                memo[n] = bool(n.arg.free_symbols & vs)
            else:
                memo[n] = any(memo[s] for s in n.src)
        return memo

    # -- hooks ------------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        strides = [sympy.Symbol(f"{name}_s{d}") for d in range(len(buf.shape))]
        names = dict(self.names)
        own = load_mask(n)
        for k, v in enumerate(load_indirect(n)):  # gathered indices: checked against their dim
            dims = [d for d, i in enumerate(idx) if i == indirect_symbol(k)]
            value = f"int64_t({self.e.names[v]})"
            if own is not None:  # a masked-off lane's index may be anything: it reads nothing
                value = f"({self.e.names[own]} ? {value} : int64_t(0))"
            if dims:
                checked = self.e.fresh()
                self.e.helpers_used.add("tw_index")
                self.e.line(f"const int64_t {checked} = tw_index({value}, {ccode(buf.shape[dims[0]], self.names)}, tw_err);")
                value = checked
            names[indirect_symbol(k)] = value
        off = ccode(offset(idx, strides), names)
        value = self.e.load_value(f"{name}[{off}]", buf.dtype)
        ct = dtypes.compute_type(n.dtype)
        if buf.dtype != n.dtype and dtypes.compute_type(buf.dtype) != ct:
            value = f"{CTYPE[ct]}({value})"
        if own is not None:  # a masked load (cat, pad): only where the mask holds, else 0
            return f"({self.e.names[own]} ? {CTYPE[ct]}({value}) : {literal(0, ct)})"
        return value

    def _index(self, n: Node) -> str:
        return f"{CTYPE[dtypes.compute_type(n.dtype)]}({ccode(n.arg, self.names)})"

    def _unbound_reduction(self, n: Node, v: str) -> str:  # pragma: no cover - guarded
        raise UnsupportedProblemError("a reduction outside its pass (the body binds every reduction first)")

    # -- pieces -----------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.e.line(text)

    def indent(self, step: int) -> None:
        self.e.indent = self.e.indent + "  " if step > 0 else self.e.indent[:-2]

    def decompose(self, flat: str, vars_, ranges) -> None:
        """Lines defining each used variable from the flat index (row-major)."""
        for v, text in unflatten(flat, vars_, ranges, self.k.used_vars(), lambda e: ccode(e, self.names), "/"):
            self.line(f"const int64_t {v.name} = {text};")

    def hoist(self, roots: list[Node], depends: dict[Node, bool]) -> None:
        """Emit now the values ``roots`` read that do not vary in the loop about to open."""
        names = self.e.names
        for n in toposort(roots, stop=lambda n: n in names or not depends[n]):
            if n not in names and not depends[n] and n.op != "const":
                self.e.emit(n)

    def store(self, s: Store) -> None:
        buf = self.k.buffer(s.buffer)
        node = self.value[id(s)]
        if node.op == "cast" and node.dtype == buf.dtype and dtypes.is_float(node.dtype):
            node = node.src[0]  # the store rounds once; no need to round before it too
        value = self.e.emit(node)
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = ccode(offset(s.index, strides), self.names)
        text = f"{buf.name}[{off}] = {self.e.store_value(value, node.dtype, buf.dtype)};"
        mask = self.mask[id(s)]
        if mask is not None:  # a combo kernel's part: only its own share of the space
            text = f"if ({self.e.emit(mask)}) {text}"
        self.line(text)

    def on_r(self, s: Store) -> bool:
        mask = self.mask[id(s)]
        return self.dep_r[self.value[id(s)]] or mask is not None and self.dep_r[mask]

    # -- pointwise ----------------------------------------------------------------------------------
    def pointwise(self) -> None:
        """Inside a task: the row's variables, its invariant values, then the vectorised loop
        along the last dim over ``[tw_lo, tw_hi)``."""
        k = self.k
        inner = self.xvars[-1:] if self.xvars else ()
        if len(k.ranges) > 1:
            self.decompose("tw_row", self.xvars[:-1], k.ranges[:-1])
        roots = [self.value[id(s)] for s in k.stores] + [m for m in self.mask.values() if m is not None]
        self.hoist(roots, self._depends(inner))
        self.line("#pragma omp simd")
        self.line("for (int64_t tw_col = tw_lo; tw_col < tw_hi; ++tw_col) {")
        self.indent(1)
        self.e.push()
        if inner:
            self.line(f"const int64_t {inner[0].name} = tw_col;")
        for s in k.stores:
            self.store(s)
        self.e.pop()
        self.indent(-1)
        self.line("}")

    # -- reductions ---------------------------------------------------------------------------------
    def reduce_rows(self) -> None:
        """One row (``xindex``): a pass per level of reductions, the row's stores, then one pass
        for the values stored per element."""
        k = self.k
        self.decompose("xindex", self.xvars, k.ranges)
        reduces = [n for n in self.nodes if n.is_reduce]
        level: dict[Node, int] = {}
        for n in self.nodes:
            below = max((level[s] for s in n.src), default=0)
            level[n] = below + (1 if n.is_reduce else 0)
        levels = [[r for r in reduces if level[r] == lv] for lv in sorted({level[r] for r in reduces})]
        x_stores = [s for s in k.stores if not self.on_r(s)]
        r_stores = [s for s in k.stores if self.on_r(s)]
        passes = [[r.src[0] for r in group] for group in levels]
        final = [self.value[id(s)] for s in r_stores] + [self.mask[id(s)] for s in r_stores if self.mask[id(s)] is not None]
        if self.persistent:
            self._plan_caches(passes + ([final] if r_stores else []))
        for p, group in enumerate(levels):
            self.pass_index = p
            self._pass(group)
        self.pass_index = len(levels)
        for s in x_stores:
            self.store(s)
        if r_stores:
            self.hoist(final, self.dep_r)
            self.line("#pragma omp simd")
            self.line("for (int64_t rindex = 0; rindex < rnumel; ++rindex) {")
            self.indent(1)
            self._open_row_element()
            for s in r_stores:
                self.store(s)
            self.e.pop()
            self.indent(-1)
            self.line("}")

    def _cheap(self, n: Node) -> bool:
        """Values as cheap to compute again as to read from a row buffer."""
        if n.op == "load":
            return not n.src
        if n.op in ("index", "const"):
            return True
        return n.op == "cast" and self._cheap(n.src[0])

    def _plan_caches(self, passes: list[list[Node]]) -> None:
        """Which values one pass computes and a later pass reads: those get a row buffer."""
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

    def _open_row_element(self) -> None:
        """Open the scope of one element of the row: ``rindex``'s variables, the buffered
        values of earlier passes."""
        self.e.push()
        self.decompose("rindex", self.rvars, self.k.reduction_ranges)
        for n, (name, computed_in) in self.cached.items():
            if computed_in < self.pass_index and n not in self.e.names:
                self.e.bind(n, f"{name}[rindex]")

    @property
    def rbase(self) -> str:
        return f"tw_rbase{self.pass_index}"

    def _pass(self, reduces: list[Node]) -> None:
        """One pass over the row computing ``reduces`` into ``L`` lanes each, then the lanes
        combined into one value per reduction."""
        e = self.e
        self.hoist([r.src[0] for r in reduces], self.dep_r)
        plan: list[tuple[Node, list[str], str, str]] = []  # (reduction, lane arrays, kind, compute type)
        welford: dict[Node, list[str]] = {}
        for r in reduces:
            kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
            if kind in ("any", "all"):
                ct = "bool"
            c, lanes = CTYPE[ct], LANES
            if kind.startswith("welford"):
                if not dtypes.is_float(ct):
                    raise UnsupportedProblemError("Welford mean/variance of an integer value")
                if r.src[0] not in welford:
                    arrays = [e.fresh() for _ in range(3)]  # mean, m2, count
                    for a in arrays:
                        self.line(f"{c} {a}[{lanes}];")
                    self.line(f"for (int tw_l = 0; tw_l < {lanes}; ++tw_l) {{ {arrays[0]}[tw_l] = {arrays[1]}[tw_l] = "
                              f"{arrays[2]}[tw_l] = {literal(0, ct)}; }}")
                    welford[r.src[0]] = arrays
                plan.append((r, welford[r.src[0]], kind, ct))
            elif kind in ("argmax", "argmin"):
                val, idx = e.fresh(), e.fresh()
                self.line(f"{c} {val}[{lanes}]; int64_t {idx}[{lanes}];")
                self.line(f"for (int tw_l = 0; tw_l < {lanes}; ++tw_l) {{ {val}[tw_l] = {_identity(kind, ct)}; "
                          f"{idx}[tw_l] = -1; }}")
                plan.append((r, [val, idx], kind, ct))
            else:
                acc = e.fresh()
                self.line(f"{c} {acc}[{lanes}];")
                self.line(f"for (int tw_l = 0; tw_l < {lanes}; ++tw_l) {acc}[tw_l] = {_identity(kind, ct)};")
                plan.append((r, [acc], kind, ct))
        lanes = LANES
        body = self._capture(lambda: self._accumulate(plan))
        # whole steps of L lanes (one vector operation per step), then the ragged tail
        self.line(f"int64_t {self.rbase} = 0;")
        self.line(f"for (; {self.rbase} + {lanes} <= rnumel; {self.rbase} += {lanes}) {{")
        self.indent(1)
        self.line("#pragma omp simd")
        self.line(f"for (int64_t tw_l = 0; tw_l < {lanes}; ++tw_l) {{")
        for text in body:
            self.line("    " + text)
        self.line("}")
        self.indent(-1)
        self.line("}")
        self.line(f"for (int64_t tw_l = 0; {self.rbase} + tw_l < rnumel; ++tw_l) {{")
        for text in body:
            self.line("  " + text)
        self.line("}")
        self._combine(plan, lanes)

    def _capture(self, emit: Callable[[], None]) -> list[str]:
        """The lines ``emit`` writes in a fresh scope, relative to the current indent."""
        saved, indent = self.e.lines, self.e.indent
        self.e.lines, self.e.indent = [], ""
        try:
            emit()
        finally:
            out, self.e.lines, self.e.indent = self.e.lines, saved, indent
        return out

    def _accumulate(self, plan) -> None:
        e = self.e
        self.line(f"const int64_t rindex = {self.rbase} + tw_l;")
        self._open_row_element()
        updated: set[Node] = set()
        for r, arrays, kind, ct in plan:
            v = e.emit(r.src[0])
            c = CTYPE[ct]
            if kind.startswith("welford"):
                if r.src[0] in updated:
                    continue
                updated.add(r.src[0])
                mean, m2, w = (f"{a}[tw_l]" for a in arrays)
                self.line(f"{w} += {c}(1); {{ const {c} tw_d = {v} - {mean}; {mean} += tw_d / {w}; "
                          f"{m2} += tw_d * ({v} - {mean}); }}")
            elif kind in ("argmax", "argmin"):
                val, idx = (f"{a}[tw_l]" for a in arrays)
                better = ">" if kind == "argmax" else "<"
                nan = f" || ({v} != {v} && {val} == {val})" if dtypes.is_float(ct) else ""
                # rindex grows per lane: a strictly better value (or the first NaN) takes over
                self.line(f"{{ const bool tw_t = {idx} < 0 || ({v} {better} {val}){nan}; "
                          f"{val} = tw_t ? {c}({v}) : {val}; {idx} = tw_t ? rindex : {idx}; }}")
            else:
                a = f"{arrays[0]}[tw_l]"
                fn = {"sum": f"{c}({a} + {v})", "prod": f"{c}({a} * {v})",
                      "any": f"{a} || bool({v})", "all": f"{a} && bool({v})"}.get(kind)
                if fn is None:
                    better = ">" if kind == "max" else "<"
                    nan = f" || {v} != {v}" if dtypes.is_float(ct) else ""
                    fn = f"({v} {better} {a}{nan}) ? {c}({v}) : {a}"
                self.line(f"{a} = {fn};")
        for n, (name, computed_in) in self.cached.items():  # what later passes read from the row buffers
            if computed_in == self.pass_index:
                self.line(f"{name}[rindex] = {e.emit(n)};")
        e.pop()

    def _combine(self, plan, lanes: int) -> None:
        """The lanes of each reduction combined into one value, bound to the reduction."""
        e = self.e
        done: dict[Node, tuple[str, str]] = {}
        for r, arrays, kind, ct in plan:
            c, n_lanes = CTYPE[ct], LANES
            out = e.fresh()
            if kind.startswith("welford"):
                if r.src[0] not in done:
                    mean, m2, w = arrays
                    tn, tm, ts = e.fresh(), e.fresh(), e.fresh()
                    self.line(f"{c} {tn} = 0, {tm} = 0, {ts} = 0;")
                    self.line(f"for (int tw_l = 0; tw_l < {n_lanes}; ++tw_l) {{")
                    self.line(f"  if ({w}[tw_l] == 0) continue;")
                    self.line(f"  const {c} tw_nn = {tn} + {w}[tw_l], tw_d = {mean}[tw_l] - {tm};")
                    self.line(f"  {tm} += tw_d * ({w}[tw_l] / tw_nn);")
                    self.line(f"  {ts} += {m2}[tw_l] + tw_d * tw_d * ({tn} * {w}[tw_l] / tw_nn);")
                    self.line(f"  {tn} = tw_nn;")
                    self.line("}")
                    done[r.src[0]] = (tm, ts)
                e.bind(r, self._as(done[r.src[0]][0 if kind == "welford_mean" else 1], ct, r.dtype))
                continue
            if kind in ("argmax", "argmin"):
                val, idx = arrays
                better = ">" if kind == "argmax" else "<"
                bv, bi = e.fresh(), e.fresh()
                self.line(f"{c} {bv} = {val}[0]; int64_t {bi} = {idx}[0];")
                if dtypes.is_float(ct):
                    wins = (f"({val}[tw_l] {better} {bv} || ({val}[tw_l] != {val}[tw_l] && {bv} == {bv}))")
                    same = f"({val}[tw_l] == {bv} || ({val}[tw_l] != {val}[tw_l] && {bv} != {bv}))"
                else:
                    wins, same = f"({val}[tw_l] {better} {bv})", f"({val}[tw_l] == {bv})"
                self.line(f"for (int tw_l = 1; tw_l < {n_lanes}; ++tw_l) {{")
                self.line(f"  if ({idx}[tw_l] >= 0 && ({bi} < 0 || {wins} || ({same} && {idx}[tw_l] < {bi}))) "
                          f"{{ {bv} = {val}[tw_l]; {bi} = {idx}[tw_l]; }}")
                self.line("}")
                self.line(f"const int64_t {out} = {bi} < 0 ? int64_t(0) : {bi};")
                e.bind(r, self._as(out, "i64", r.dtype))
                continue
            a = arrays[0]
            self.line(f"{c} {out} = {a}[0];")
            fn = {"sum": f"{c}({out} + {a}[tw_l])", "prod": f"{c}({out} * {a}[tw_l])",
                  "any": f"{out} || {a}[tw_l]", "all": f"{out} && {a}[tw_l]"}.get(kind)
            if fn is None:
                better = ">" if kind == "max" else "<"
                nan = f" || {a}[tw_l] != {a}[tw_l]" if dtypes.is_float(ct) else ""
                fn = f"({a}[tw_l] {better} {out}{nan}) ? {a}[tw_l] : {out}"
            self.line(f"for (int tw_l = 1; tw_l < {n_lanes}; ++tw_l) {out} = {fn};")
            e.bind(r, self._as(out, ct, r.dtype))

    def _as(self, name: str, held: str, dtype: str) -> str:
        """``name`` (held in compute type ``held``) as a value of the reduction's dtype."""
        ct = dtypes.compute_type(dtype)
        if ct == held:
            return name
        out = self.e.fresh()
        self.line(f"const {CTYPE[ct]} {out} = {self.e.convert(name, held, dtype)};")
        return out


class _CppLoops(TemplateSpec):
    backend = "cpp"
    jinja = "loops.py.jinja"

    def supports(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if target.backend != "cpu":
            return Support(False, f"C++ loop kernels are for the cpu target, not {target.name}")
        for b in problem.kernel.inputs + problem.kernel.outputs:
            if b.dtype not in STORAGE:
                return Support(False, f"{b.dtype} buffers ({b.name}) have no C++ conversion here")
        if any(n.op == "acc" for n in problem.kernel.nodes()):
            return Support(False, "GEMM accumulators belong to a GEMM template")
        from tilewright.runtime import cpp as runtime

        if (why := runtime.unavailable_reason()) is not None:
            return Support(False, why)
        return SUPPORTED

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        return self.space_refusal(params)

    def render(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        params = self.space.complete(params)
        support = self.supports(problem, target)
        if not support:
            raise UnsupportedProblemError(f"{self.id} cannot run {problem.describe()}: {support.reason}")
        if (why := self.check(params, problem, target)) is not None:
            raise UnsupportedProblemError(f"{self.id} params {dict(params)} on {target.name}: {why}")
        k = problem.kernel
        names = {s: s.name for s in k.size_symbols()}
        source = self.render_jinja(
            problem_text=problem.describe().replace("\n", "\n# "), params_text=self.space.encode(params),
            target=target.name, name=f"cpp_{problem.kind}",
            inputs=[b.name for b in k.inputs], sizes=[s.name for s in k.size_symbols()],
            outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]),
                      "shape": [py_code(s, names) for s in b.shape],
                      "stride": [py_code(s, names) for s in b.stride]} for b in k.outputs],
            block=int(params.get("BLOCK", 4096)), op=(problem.op or problem.kind).replace('"', "'"),
            **source_context(k, bool(params.get("PERSISTENT", False))))
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
                             "buffer the values later passes read in a row buffer per thread"),))

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        if (why := self.space_refusal(params)) is not None:
            return why
        if self.space.complete(params)["PERSISTENT"] and problem.rnumel > PERSISTENT_MAX_ROW:
            return f"a row of {problem.rnumel} is too long to buffer (PERSISTENT=False loops over it)"
        return None

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        """The persistent form where the row fits, the looped one for long rows (each one
        build: the knob changes the source)."""
        out = [{"PERSISTENT": True}] if problem.rnumel <= PERSISTENT_MAX_ROW else []
        return out + ([{"PERSISTENT": False}] if problem.rnumel >= LOOPED_MIN_ROW or not out else [])

"""SYCL templates for loop kernels (:class:`~tilewright.problem.LoopProblem`), for the ``xpu``
target: free-function ``nd_range`` kernels compiled at run time by the SYCL runtime
(:mod:`tilewright.runtime.sycl`).

Pointwise (``sycl.pointwise``): one work-item per element of the flattened iteration space, in
work-groups of ``WG``; the global range is ``xnumel`` rounded up to ``WG`` and the work-items
past the end return.

Reduction (``sycl.reduction``): one work-group of ``WG`` work-items per row (output point). Each
work-item walks the row with stride ``WG`` (any row length: rows longer than the group are
looped), keeping a partial accumulator per reduction; the partials are combined with
``sycl::reduce_over_group``, whose result every work-item of the group holds. Dependent
reductions (softmax's max, then the sum of ``exp(x - max)``) take one pass over the row per
level; values stored per element take one more pass; values stored per row are written by
work-item 0. Combining rules: sums, products, any/all directly; max/min propagate NaN through a
separate "any NaN" group reduction; argmax/argmin take the extreme, then the smallest index
holding it (first occurrence, NaN largest, as torch); Welford mean/M2 are combined exactly from
each work-item's (count, mean, M2) as ``mean = Σ wᵢ meanᵢ / W`` and
``M2 = Σ M2ᵢ + Σ wᵢ (meanᵢ - mean)²``.

Loads and stores index buffers through run-time strides (kernel arguments, in elements), so any
layout is read and written correctly. Index arithmetic is 64-bit (``int64_t``). Refused: fp8
buffers (no conversion written), GEMM accumulators (``acc``), and targets other than ``xpu``.

Device and tensor mapping: the ``xpu`` target's kernels run on whatever device the SYCL runtime
selects (an Intel GPU through Level Zero; on a host without one, the OpenCL CPU device of
``intel-opencl-rt``), and the launcher takes **CPU** torch tensors: the CPU device reads them in
place (zero-copy), a device that cannot read host memory gets them staged through USM shared
allocations (see :mod:`tilewright.runtime.sycl`).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask, toposort
from tilewright.ir.index import CodePrinter, offset, provably_nonnegative, unflatten
from tilewright.ir.index import code as py_code
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)
from tilewright.templates.sycl.emit import CTYPE, STORAGE, SyclExpr, literal


class CPrinter(CodePrinter):
    """Integer index expressions as C++ (``int64_t``): ``floor(a/b)`` as ``a / b`` and ``Mod``
    as ``%`` (exact for the non-negative values indices take), integers as 64-bit literals."""

    def _print_floor(self, expr: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        n, d = self._print(num), self._print(den)
        if provably_nonnegative(num):
            return f"(({n}) / ({d}))"
        # a negative numerator (sympy moves integer terms out of a floor): C's / truncates, so
        # divide exactly after taking off the true remainder (see CodePrinter)
        return f"((({n}) - ((({n}) % ({d})) + ({d})) % ({d})) / ({d}))"

    def _print_ceiling(self, expr: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        d = self._print(den)
        return f"(({self._print(num)} + {d} - 1) / ({d}))"

    def _print_Max(self, expr: sympy.Expr) -> str:
        return "sycl::max(" + ", ".join(f"int64_t({self._print(a)})" for a in expr.args) + ")" \
            if len(expr.args) == 2 else self._nest(expr, "sycl::max")

    def _print_Min(self, expr: sympy.Expr) -> str:
        return "sycl::min(" + ", ".join(f"int64_t({self._print(a)})" for a in expr.args) + ")" \
            if len(expr.args) == 2 else self._nest(expr, "sycl::min")

    def _nest(self, expr: sympy.Expr, fn: str) -> str:
        args = [f"int64_t({self._print(a)})" for a in expr.args]
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out

    def _print_Integer(self, expr: sympy.Expr) -> str:
        return f"int64_t({int(expr)}LL)" if abs(int(expr)) > 2**31 - 1 else f"{int(expr)}L"


def ccode(e: Any, names: dict[sympy.Symbol, str] | None = None) -> str:
    return CPrinter(names).doprint(sympy.sympify(e))


# reduction kind -> identity (as C++ for a compute type)
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
    raise UnsupportedProblemError(f"SYCL reductions do not know {kind!r}")


def _int_limit(ct: str, low: bool) -> str:
    if ct == "bool":
        return "false" if low else "true"
    return f"std::numeric_limits<{CTYPE[ct]}>::{'lowest' if low else 'max'}()"


class _Body:
    """The kernel body of one loop problem: variables, loads, stores, reductions."""

    def __init__(self, kernel: LoopKernel):
        self.k = kernel
        self.reduction = kernel.kind == "reduction"
        self.xvars, self.rvars = kernel.x_vars, kernel.r_vars
        self.names = {s: s.name for s in kernel.size_symbols()}
        self.e = SyclExpr(load=self._load, index=self._index, reduce=self._reduce_persistent_unsupported)
        self.welford: dict[int, tuple[str, str]] = {}

    # -- hooks ------------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        strides = [sympy.Symbol(f"{name}_s{d}") for d in range(len(buf.shape))]
        names = dict(self.names)
        for k, v in enumerate(load_indirect(n)):  # gathered indices: the values computed for them
            names[indirect_symbol(k)] = f"int64_t({self.e.names[v]})"
        off = ccode(offset(idx, strides), names)
        value = self.e.load_value(f"{name}[{off}]", buf.dtype)
        ct = dtypes.compute_type(n.dtype)
        if buf.dtype != n.dtype and dtypes.compute_type(buf.dtype) != ct:
            value = f"{CTYPE[ct]}({value})"
        own = load_mask(n)
        if own is not None:  # a masked load (cat, pad): only where the mask holds, else 0
            return f"({self.e.names[own]} ? {CTYPE[ct]}({value}) : {literal(0, ct)})"
        return value

    def _index(self, n: Node) -> str:
        return f"{CTYPE[dtypes.compute_type(n.dtype)]}({ccode(n.arg, self.names)})"

    def _reduce_persistent_unsupported(self, n: Node, v: str) -> str:  # pragma: no cover - guarded
        raise UnsupportedProblemError("a reduction outside its pass (the emitter binds every reduction first)")

    # -- pieces -----------------------------------------------------------------------------------
    def decompose(self, flat: str, vars_, ranges) -> None:
        """Lines defining each used variable from the flat index (row-major)."""
        for v, text in unflatten(flat, vars_, ranges, self.k.used_vars(), lambda e: ccode(e, self.names), "/"):
            self.e.line(f"const int64_t {v.name} = {text};")

    def store(self, s) -> None:
        buf = self.k.buffer(s.buffer)
        node = s.value
        if node.op == "cast" and node.dtype == buf.dtype and dtypes.is_float(node.dtype):
            node = node.src[0]  # the store rounds once; no need to round before it too
        value = self.e.emit(node)
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = ccode(offset(s.index, strides), self.names)
        text = f"{buf.name}[{off}] = {self.e.store_value(value, node.dtype, buf.dtype)};"
        if s.mask is not None:  # a combo kernel's part: only its own share of the space
            text = f"if ({self.e.emit(s.mask)}) {text}"
        self.e.line(text)

    def on_r(self, s) -> bool:
        return self.k.depends_on_r(s.value) or s.mask is not None and self.k.depends_on_r(s.mask)

    def pointwise(self) -> None:
        self.decompose("xindex", self.xvars, self.k.ranges)
        for s in self.k.stores:
            self.store(s)

    def reduce_rows(self) -> None:
        k = self.k
        self.decompose("xindex", self.xvars, k.ranges)
        reduces = k.reductions()
        level: dict[int, int] = {}
        for n in toposort(k.values() + [s.mask for s in k.stores if s.mask is not None]):
            below = max((level.get(id(s), 0) for s in n.src), default=0)
            level[id(n)] = below + (1 if n.is_reduce else 0)
        for lv in sorted({level[id(r)] for r in reduces}):
            self._pass([r for r in reduces if level[id(r)] == lv])
        x_stores = [s for s in k.stores if not self.on_r(s)]
        r_stores = [s for s in k.stores if self.on_r(s)]
        if x_stores:
            self.e.line("if (lid == 0) {")
            self.e.indent += "  "
            self.e.push()
            for s in x_stores:
                self.store(s)
            self.e.pop()
            self.e.indent = self.e.indent[:-2]
            self.e.line("}")
        if r_stores:
            self._open_loop()
            for s in r_stores:
                self.store(s)
            self._close_loop()

    def _open_loop(self) -> None:
        self.e.line("for (int64_t rindex = lid; rindex < rnumel; rindex += WG) {")
        self.e.indent += "  "
        self.e.push()
        self.decompose("rindex", self.rvars, self.k.reduction_ranges)

    def _close_loop(self) -> None:
        self.e.pop()
        self.e.indent = self.e.indent[:-2]
        self.e.line("}")

    def _pass(self, reduces: list[Node]) -> None:
        """One pass over the row computing ``reduces`` (their operands need only earlier
        levels), then the group reductions that give every work-item their values."""
        e = self.e
        plan: list[tuple[Node, list[str]]] = []
        welford: dict[int, list[str]] = {}
        for r in reduces:
            kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
            if kind in ("any", "all"):
                ct = "bool"
            c = CTYPE[ct]
            if kind.startswith("welford"):
                if not dtypes.is_float(ct):
                    raise UnsupportedProblemError("Welford mean/variance of an integer value")
                if id(r.src[0]) not in welford:
                    accs = [e.fresh() for _ in range(3)]  # mean, m2, count
                    for a in accs:
                        e.line(f"{c} {a} = {literal(0, ct)};")
                    welford[id(r.src[0])] = accs
                plan.append((r, welford[id(r.src[0])]))
            elif kind in ("argmax", "argmin"):
                val, idx = e.fresh(), e.fresh()
                e.line(f"{c} {val} = {_identity(kind, ct)};")
                e.line(f"int64_t {idx} = std::numeric_limits<int64_t>::max();")
                plan.append((r, [val, idx]))
            else:
                acc = e.fresh()
                e.line(f"{c} {acc} = {_identity(kind, ct)};")
                plan.append((r, [acc]))
        self._open_loop()
        updated: set[int] = set()
        for r, accs in plan:
            v = e.emit(r.src[0])
            kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
            if kind.startswith("welford"):
                if id(r.src[0]) in updated:
                    continue
                updated.add(id(r.src[0]))
                mean, m2, w = accs
                e.line(f"{w} += 1; {{ const {CTYPE[ct]} d = {v} - {mean}; {mean} += d / {w}; "
                       f"{m2} += d * ({v} - {mean}); }}")
            elif kind in ("argmax", "argmin"):
                val, idx = accs
                better = ">" if kind == "argmax" else "<"
                nan = f" || ({v} != {v} && {val} == {val})" if dtypes.is_float(ct) else ""
                # rindex grows: a strictly better value (or the first NaN) takes over, ties keep the first
                e.line(f"if (({v} {better} {val}){nan} || {idx} == std::numeric_limits<int64_t>::max()) "
                       f"{{ if (!({val} != {val})) {{ {val} = {v}; {idx} = rindex; }} }}")
            elif kind in ("any", "all"):
                op = "||" if kind == "any" else "&&"
                e.line(f"{accs[0]} = {accs[0]} {op} bool({v});")
            else:
                a = accs[0]
                fn = {"sum": f"{a} + {v}", "prod": f"{a} * {v}",
                      "max": f"({v} != {v} || {v} > {a}) && !({a} != {a}) ? {v} : {a}",
                      "min": f"({v} != {v} || {v} < {a}) && !({a} != {a}) ? {v} : {a}"}[kind]
                e.line(f"{a} = {fn};")
        self._close_loop()
        done: dict[int, tuple[str, str]] = {}
        for r, accs in plan:
            kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
            c = CTYPE[ct]
            out = e.fresh()
            if kind.startswith("welford"):
                if id(r.src[0]) not in done:
                    mean, m2, w = accs
                    tw, tm, tm2 = e.fresh(), e.fresh(), e.fresh()
                    e.line(f"const {c} {tw} = sycl::reduce_over_group(grp, {w}, sycl::plus<{c}>());")
                    e.line(f"const {c} {tm} = sycl::reduce_over_group(grp, {w} * {mean}, sycl::plus<{c}>()) / {tw};")
                    e.line(f"const {c} {tm2} = sycl::reduce_over_group(grp, {m2} + {w} * ({mean} - {tm}) * "
                           f"({mean} - {tm}), sycl::plus<{c}>());")
                    done[id(r.src[0])] = (tm, tm2)
                e.bind(r, done[id(r.src[0])][0 if kind == "welford_mean" else 1])
                continue
            if kind in ("argmax", "argmin"):
                val, idx = accs
                best = self._extreme(val, "max" if kind == "argmax" else "min", ct)
                hit = f"({val} == {best} || ({best} != {best} && {val} != {val}))" if dtypes.is_float(ct) \
                    else f"({val} == {best})"
                e.line(f"const int64_t {out} = sycl::reduce_over_group(grp, {hit} ? {idx} : "
                       f"std::numeric_limits<int64_t>::max(), sycl::minimum<int64_t>());")
            elif kind in ("max", "min"):
                e.line(f"const {c} {out} = {self._extreme(accs[0], kind, ct)};")
            elif kind in ("any", "all"):
                fn = "sycl::logical_or<bool>()" if kind == "any" else "sycl::logical_and<bool>()"
                e.line(f"const bool {out} = sycl::reduce_over_group(grp, {accs[0]}, {fn});")
            else:
                fn = {"sum": "plus", "prod": "multiplies"}[kind]
                e.line(f"const {c} {out} = sycl::reduce_over_group(grp, {accs[0]}, sycl::{fn}<{c}>());")
            e.bind(r, out)

    def _extreme(self, partial: str, kind: str, ct: str) -> str:
        """The group's max/min of ``partial`` (NaN when any work-item holds one), as a name."""
        e, c = self.e, CTYPE[ct]
        out = e.fresh()
        e.line(f"const {c} {out}_v = sycl::reduce_over_group(grp, {partial}, sycl::{'maximum' if kind == 'max' else 'minimum'}<{c}>());")
        if dtypes.is_float(ct):
            e.line(f"const bool {out}_nan = sycl::reduce_over_group(grp, bool({partial} != {partial}), sycl::logical_or<bool>());")
            e.line(f"const {c} {out} = {out}_nan ? {literal(float('nan'), ct)} : {out}_v;")
        else:
            e.line(f"const {c} {out} = {out}_v;")
        return out


class _SyclLoops(TemplateSpec):
    backend = "sycl"
    jinja = "loops.py.jinja"

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if target.backend != "xpu":
            return Support(False, f"SYCL kernels are for the xpu target, not {target.name}")
        for b in problem.kernel.inputs + problem.kernel.outputs:
            if b.dtype not in STORAGE:
                return Support(False, f"{b.dtype} buffers ({b.name}) have no SYCL conversion here")
        if any(n.op == "acc" for n in problem.kernel.nodes()):
            return Support(False, "GEMM accumulators belong to a GEMM template")
        return SUPPORTED

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        return self.space_refusal(params)

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        k = problem.kernel
        body = _Body(k)
        if problem.kind == "pointwise":
            body.pointwise()
        else:
            body.reduce_rows()
        names = {s: s.name for s in k.size_symbols()}
        buffers = list(k.inputs) + list(k.outputs)
        out_names = {b.name for b in k.outputs}
        params_c = [f"{'' if b.name in out_names else 'const '}{STORAGE[b.dtype]} *__restrict__ {b.name}"
                    for b in buffers]
        strides = [f"{b.name}_s{d}" for b in buffers for d in range(len(b.shape))]
        sizes = [s.name for s in k.size_symbols()]
        kernel_name = f"tw_sycl_{problem.kind}"
        source = self.render_jinja(
            problem_text=problem.describe().replace("\n", "\n# "), params_text=self.space.encode(params),
            target=target.name, kernel_name=kernel_name, reduction=problem.kind == "reduction",
            helpers=body.e.helpers(), pointer_params=params_c, strides=strides, sizes=sizes,
            body=body.e.lines, WG=params["WG"],
            inputs=[b.name for b in k.inputs],
            outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]),
                      "shape": [py_code(s, names) for s in b.shape],
                      "stride": [py_code(s, names) for s in b.stride]} for b in k.outputs],
            buffers=[b.name for b in buffers],
            xnumel=py_code(k.xnumel, names), rnumel=py_code(k.rnumel, names),
        )
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=f"sycl_{problem.kind}", meta={"kind": problem.kind, "language": "sycl"})


class SyclPointwise(_SyclLoops):
    """Pointwise kernels: one work-item per element, ``WG`` work-items per work-group."""

    id = "sycl.pointwise"
    op = "pointwise"
    space = ParamSpace((Knob("WG", powers_of_two(16, 1024), 256, "work-items per work-group"),))


class SyclReduction(_SyclLoops):
    """Reduction kernels: one work-group of ``WG`` work-items per row, looped over the row."""

    id = "sycl.reduction"
    op = "reduction"
    space = ParamSpace((Knob("WG", powers_of_two(16, 1024), 128, "work-items per row (work-group)"),))

"""SYCL templates for loop kernels (:class:`~tilewright.problem.LoopProblem`), for the ``xpu``
target: free-function ``nd_range`` kernels compiled at run time by the SYCL runtime
(:mod:`tilewright.templates.sycl.runtime`).

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
allocations (see :mod:`tilewright.templates.sycl.runtime`).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.expr import Node, load_mask
from tilewright.ir.index import code as py_code
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)
from tilewright.templates.c_expr import CIndexPrinter, reduction_identity
from tilewright.templates.c_loops import CFamilyBody, loop_support
from tilewright.templates.sycl.emit import CTYPE, STORAGE, SyclExpr, literal


class CPrinter(CIndexPrinter):
    """Integer index expressions as SYCL C++ (see :class:`~tilewright.templates.c_expr.CIndexPrinter`)."""

    MAX, MIN = "sycl::max", "sycl::min"


def ccode(e: Any, names: dict[sympy.Symbol, str] | None = None) -> str:
    return CPrinter(names).doprint(sympy.sympify(e))


def _identity(kind: str, ct: str) -> str:
    return reduction_identity(kind, ct, literal, _int_limit, "SYCL")


def _int_limit(ct: str, low: bool) -> str:
    return f"std::numeric_limits<{CTYPE[ct]}>::{'lowest' if low else 'max'}()"

class _Body(CFamilyBody):
    """The loop schedule in SYCL C++: one work-item per element (pointwise) or per ``WG``-strided
    share of a row (reductions), combined with ``sycl::reduce_over_group``."""

    floordiv = "/"

    def __init__(self, kernel: LoopKernel):
        self.welford: dict[int, tuple[str, str]] = {}  # value -> (mean, M2) of its group combine
        super().__init__(kernel)

    CHECK_HELPER = "tw_int_div"  # tw_index lives with the division helpers

    def ccode(self, e: Any, names: dict) -> str:
        return ccode(e, names)

    def make_emitter(self) -> SyclExpr:
        e = SyclExpr(load=self._load, index=self._index, reduce=self.reduce_inline)
        e.checked = self._checked
        return e

    # -- values -----------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        names = self.load_names(n, "int64_t({})")
        idx = list(idx)
        own = load_mask(n)
        # gathered dims: checked against their dim, not read out of it (unless proven in range);
        # a masked-off lane's index may be anything: it checks 0 and reads nothing
        self.check_gathered(n, buf, idx, names, self.e.names[own] if own is not None else None)
        return self.read(n, buf, idx, names, own)

    def write_row_stores(self, stores: list) -> None:
        self.e.line("if (lid == 0) {")
        self.e.indent += "  "
        self.e.push()
        for s in stores:
            self.store(s, None)
        self.e.pop()
        self.e.indent = self.e.indent[:-2]
        self.e.line("}")

    def open_row_loop(self) -> tuple[str, str]:
        self.e.line("for (int64_t rindex = lid; rindex < rnumel; rindex += WG) {")
        self.e.indent += "  "
        self.e.push()
        return "rindex", ""

    def close_row_loop(self) -> None:
        self.e.pop()
        self.e.indent = self.e.indent[:-2]
        self.e.line("}")

    # -- reductions: a partial per work-item, then the work-group's combine -----------------------
    def init_accumulators(self, r: Node) -> list[str]:
        e = self.e
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind in ("any", "all"):
            ct = "bool"
        c = CTYPE[ct]
        if kind.startswith("welford"):
            if not dtypes.is_float(ct):
                raise UnsupportedProblemError("Welford mean/variance of an integer value")
            accs = [e.fresh() for _ in range(3)]  # mean, m2, count
            for a in accs:
                e.line(f"{c} {a} = {literal(0, ct)};")
            return accs
        if kind in ("argmax", "argmin"):
            val, idx = e.fresh(), e.fresh()
            e.line(f"{c} {val} = {_identity(kind, ct)};")
            e.line(f"int64_t {idx} = std::numeric_limits<int64_t>::max();")
            return [val, idx]
        acc = e.fresh()
        e.line(f"{c} {acc} = {_identity(kind, ct)};")
        return [acc]

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        e = self.e
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind.startswith("welford"):
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

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        e = self.e
        kind, ct = r.arg, dtypes.compute_type(r.src[0].dtype)
        c = CTYPE[ct]
        out = e.fresh()
        if kind.startswith("welford"):
            if owner:
                mean, m2, w = accs
                tw, tm, tm2 = e.fresh(), e.fresh(), e.fresh()
                e.line(f"const {c} {tw} = sycl::reduce_over_group(grp, {w}, sycl::plus<{c}>());")
                e.line(f"const {c} {tm} = sycl::reduce_over_group(grp, {w} * {mean}, sycl::plus<{c}>()) / {tw};")
                e.line(f"const {c} {tm2} = sycl::reduce_over_group(grp, {m2} + {w} * ({mean} - {tm}) * "
                       f"({mean} - {tm}), sycl::plus<{c}>());")
                self.welford[id(r.src[0])] = (tm, tm2)
            return self.welford[id(r.src[0])][0 if kind == "welford_mean" else 1]
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
        return out

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
        return loop_support(self, problem, target, backend="xpu", kernels="SYCL kernels",
                            language="SYCL", storage=STORAGE)

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        return self.space_refusal(params)

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        k = problem.kernel
        body = _Body(k).build()  # rows are always looped (one work-group per row)
        names = {s: s.name for s in k.size_symbols()}
        buffers = list(k.inputs) + list(k.outputs)
        out_names = {b.name for b in k.outputs}
        params_c = [f"{'' if b.name in out_names else 'const '}{STORAGE[b.dtype]} *__restrict__ {b.name}"
                    for b in buffers]
        # the kernel's checks (gathered indices, integer division by zero) report here
        err_flag = "tw_int_div" in body.e.helpers_used
        if err_flag:
            params_c.append("int64_t *__restrict__ tw_err")
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
            buffers=[b.name for b in buffers], err_flag=err_flag,
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

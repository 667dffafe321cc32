"""Scans and scatters of the C++ loop body (mixed into ``loops._Body``): a row's prefix carried
through a loop that walks the row in order, and stores through data-dependent indices.

**Scans** (cumsum, cumprod, logcumsumexp, cummax/cummin values and indices). The C++ body loops
over rows (``LoopSchedule.looped_rows``); a pass over the row that computes a scan declares its
carry before the loop (:meth:`CppRowOps.init_scan`) and each element combines its value into the
carry in order (:meth:`CppRowOps.scan_step`). Such a pass has no ``#pragma omp simd``: its
elements depend on each other, and the 16-lane reduction steps that share the pass run in
order. Each combine is torch's CPU kernel's, element by element: a sum from 0 (so ``-0.0``
alone is ``+0.0``), a product from 1, ``logcumsumexp`` as ``log1p(exp(min - max)) + max`` with
equal infinities kept and NaN propagated, cummax (cummin) taking an element that is NaN or
``>=`` (``<=``) the running value unless that is NaN (the latest of ties, the latest NaN).
Sums accumulate in the IR's compute type (fp32 for fp32, bf16 and fp16; eager's CPU cumsum
carries fp32 in double, so the two differ by fp32 rounding, within the fp32 tolerance).

**Scatters** (index_put, scatter, scatter_add, scatter_reduce, index_add, the embedding's
backward, histc: :class:`~tilewright.ir.kernel.Store` with ``indirect``). Every element of the
kernel's space is visited once and in row-major order within a thread, so the result is
deterministic whatever the thread count: an accumulating scatter adds its values in the order
eager's CPU kernels do (the index's order), and a plain write with duplicate indices keeps the
last value in row-major order (eager's where its kernel runs on one thread; torch calls the
result undefined). No atomics: threads only split the space along loop variables that are a
target coordinate of every scatter store (:func:`scatter_plan`), where two threads can never
write one element; along the others the loops stay in one thread and in order, and the row loop
is vectorised only where its variable is such a coordinate. An index outside its dim is never
written; it reports ``IndexError`` (as eager) unless proven in range or
``config.index_checks`` is off. amax/amin propagate NaN and keep the target's value on a tie
(``std::max``/``std::min`` as eager's scatter_reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.bounds import checks_enabled, proven_in_range, var_ranges
from tilewright.ir.expr import Node, indirect_symbol
from tilewright.ir.index import offset
from tilewright.ir.kernel import LoopKernel
from tilewright.templates.cpp.emit import CTYPE, ERR_INDEX, ccode, literal

SCAN_KINDS = ("sum", "prod", "logsumexp", "max", "argmax", "min", "argmin")
VECTOR_SUMS = ("fp32", "fp64", "i64", "i32")  # the types tw_prefix_sum has
MAX_SCAN_ROW = 1 << 22  # longer rows (16 MiB of fp32 per thread) scan in order, unbuffered


@dataclass(frozen=True)
class ScatterPlan:
    """How a kernel (one part of it) with scatter stores may be split and vectorised: by the
    loop variables that are a target coordinate of every scatter store (two iterations that
    differ in one of them write different elements)."""

    rows_parallel: bool  # threads may take different rows (every row variable is such a coordinate)
    inner_parallel: bool  # the innermost loop may be vectorised and split (its variable is one)


def _plain_vars(kernel: LoopKernel) -> set[sympy.Symbol] | None:
    """The loop variables that index a dim of every scatter store's target as themselves; None
    when the kernel has no scatter."""
    scatters = kernel.scatters()
    if not scatters:
        return None
    loop_vars = set(kernel.x_vars) | set(kernel.r_vars)
    plain: set[sympy.Symbol] | None = None
    for s in scatters:
        own = {sympy.sympify(e) for e in s.index} & loop_vars
        plain = own if plain is None else plain & own
    return plain or set()


def scatter_plan(kernel: LoopKernel) -> ScatterPlan:
    """The :class:`ScatterPlan` of one kernel part: rows are the outer variables (a reduction's
    ``xindex``, every dim but the last of a pointwise space), the inner loop the last dim
    (pointwise) or the row (reduction)."""
    plain = _plain_vars(kernel)
    if plain is None:
        return ScatterPlan(True, True)
    if kernel.kind == "reduction":
        rows, inner = kernel.x_vars, kernel.r_vars
    else:
        rows, inner = kernel.x_vars[:-1], kernel.x_vars[-1:]
    return ScatterPlan(all(v in plain for v in rows), all(v in plain for v in inner))


class CppRowOps:
    """Scan and scatter hooks of the C++ loop schedule (``self.e``, ``self.k``, ``self.names``
    come from :class:`~tilewright.templates.loop_schedule.LoopSchedule`; ``self.caches`` and
    ``self.scan_buffers`` from ``loops._Body``)."""

    # -- sums: a pass of their own into a row buffer, summed a vector at a time -----------------
    def vector_scan(self, n: Node) -> bool:
        """Whether scan ``n`` runs as its own pass into a row buffer and ``tw_prefix_sum``
        (sums of fp32, fp64, int64, int32 along rows that fit a buffer), not in order with a
        carry inside the pass that reads it."""
        rn = sympy.sympify(self.k.rnumel)
        return (n.is_scan and n.arg == "sum" and dtypes.compute_type(n.src[0].dtype) in VECTOR_SUMS
                and not (rn.is_number and int(rn) > MAX_SCAN_ROW))

    def open_row(self, roots=()) -> None:
        """:meth:`LoopSchedule.open_row`, with the sums the loop needs computed first, each in a
        pass of its own (:meth:`scan_pass`), and read from their row buffers in the loop."""
        from tilewright.ir.expr import toposort

        self.carries = {}
        for n in toposort(roots, stop=lambda n: n in self.e.names or n in self.scan_buffers):
            if not n.is_scan or n in self.e.names or n in self.scan_buffers:
                continue
            if self.vector_scan(n):
                self.scan_pass(n)
            else:
                self.carries[n] = self.init_scan(n)
        rindex, suffix = self.open_row_loop()
        self.decompose(rindex, self.rvars, self.k.reduction_ranges, suffix)

    def scan_pass(self, n: Node) -> None:
        """A vectorised loop writing the operand of sum ``n`` along the row to a row buffer of
        its own, then ``tw_prefix_sum`` over the buffer: later loops read ``n`` from it."""
        e = self.e
        ct = dtypes.compute_type(n.src[0].dtype)
        buf = f"tw_scan{len(self.scan_buffers)}"
        self.caches.append((buf, CTYPE[ct]))
        self.hoist([n.src[0]], self.dep_r)
        e.line("#pragma omp simd")
        e.line("for (int64_t rindex = 0; rindex < rnumel; ++rindex) {")
        e.indent += "  "
        e.push()
        self.bind_row_values()
        self.decompose("rindex", self.rvars, self.k.reduction_ranges)
        e.line(f"{buf}[rindex] = {e.emit(n.src[0])};")
        e.pop()
        e.indent = e.indent[:-2]
        e.line("}")
        e.helpers_used.add("tw_prefix_sum")
        e.line(f"tw_prefix_sum({buf}, rnumel);")
        self.scan_buffers[n] = buf

    def bind_row_values(self) -> None:
        """Inside a loop over the row: the values earlier passes left in row buffers (sums,
        and the ``PERSISTENT`` caches of earlier passes) as reads of them."""
        for n, buf in self.scan_buffers.items():
            if n not in self.e.names:
                self.e.bind(n, f"{buf}[rindex]")
        for n, (name, computed_in) in self.cached.items():
            if computed_in < self.pass_index and n not in self.e.names:
                self.e.bind(n, f"{name}[rindex]")

    # -- other scans: a carry combined with each element in order --------------------------------
    def init_scan(self, n: Node) -> list[str]:
        kind, ct = n.arg, dtypes.compute_type(n.src[0].dtype)
        if kind not in SCAN_KINDS:
            raise UnsupportedProblemError(f"C++ scans do not know {kind!r}")
        c = CTYPE[ct]
        carry = self.e.fresh()
        if kind in ("sum", "prod", "logsumexp"):
            init = literal({"sum": 0, "prod": 1, "logsumexp": float("-inf")}[kind], ct)
            self.e.line(f"{c} {carry} = {init};")
            return [carry]
        init = self._extreme(kind, ct)  # the type's lowest (highest); false (true) for bools
        index = self.e.fresh()
        self.e.line(f"{c} {carry} = {init}; int64_t {index} = -1;")
        return [carry, index]

    @staticmethod
    def _extreme(kind: str, ct: str) -> str:
        from tilewright.templates.cpp.loops import _identity

        return _identity("max" if kind in ("max", "argmax") else "min", ct)

    def scan_step(self, n: Node, v: str, carries: list[str]) -> str:
        kind, ct = n.arg, dtypes.compute_type(n.src[0].dtype)
        c = CTYPE[ct]
        e = self.e
        if kind in ("sum", "prod"):
            (carry,) = carries
            e.line(f"{carry} = {c}({carry} {'+' if kind == 'sum' else '*'} {v});")
            return carry  # the emitter names a copy of it (the carry changes at the next step)
        if kind == "logsumexp":
            (carry,) = carries
            f = "f" if ct == "fp32" else ""
            # torch's _log_add_exp_helper: NaN propagates (min != max), equal infinities stay
            e.line(f"{{ const {c} tw_x = {v}; const bool tw_n = tw_x != tw_x;")
            e.line(f"  const {c} tw_mn = tw_n ? tw_x : (tw_x < {carry} ? tw_x : {carry});")
            e.line(f"  const {c} tw_mx = tw_n ? tw_x : (tw_x > {carry} ? tw_x : {carry});")
            e.line(f"  {carry} = (tw_mn != tw_mx || __builtin_isfinite(tw_mn)) ? "
                   f"{c}(log1p{f}(exp{f}(tw_mn - tw_mx)) + tw_mx) : {carry}; }}")
            return carry
        value, index = carries
        ge = ">=" if kind in ("max", "argmax") else "<="
        take = f"({v} {ge} {value})"
        if dtypes.is_float(ct):  # a NaN takes over and then stays (the latest NaN's index)
            take = f"({v} != {v} || ({value} == {value} && {take}))"
        e.line(f"{{ const bool tw_t = {take}; {value} = tw_t ? {c}({v}) : {value}; "
               f"{index} = tw_t ? int64_t(rindex) : {index}; }}")
        return index if kind.startswith("arg") else value

    # -- scatters --------------------------------------------------------------------------------
    bad_flag: str | None = None  # the failures of the checked loop being written (tw_bad)

    def open_checked_loop(self, simd: bool) -> None:
        """Before a loop over elements: ``#pragma omp simd`` where ``simd``. A vectorised loop
        whose scatters check their indices collects the failures in a flag (an ``|``
        reduction: a call that stores the error inside the loop keeps g++ from vectorising
        it), reported after the loop (:meth:`close_checked_loop`)."""
        self.bad_flag = None
        if simd and checks_enabled() and self.k.scatters():
            self.bad_flag = self.e.fresh()
            self.e.line(f"int64_t {self.bad_flag} = 0;")
            self.e.line(f"#pragma omp simd reduction(|:{self.bad_flag})")
        elif simd:
            self.e.line("#pragma omp simd")

    def close_checked_loop(self) -> None:
        if self.bad_flag is not None:
            self.e.line(f"if ({self.bad_flag}) __atomic_store_n(tw_err, int64_t({ERR_INDEX}), __ATOMIC_RELAXED);")
        self.bad_flag = None

    def write_scatter(self, s, buf, node: Node, value: str) -> None:
        """``buf[index] = value`` (or combined by ``s.accumulate``) where the data-dependent index
        lies inside the buffer; outside it nothing is written and ``IndexError`` is reported
        (unless proven in range or checks are off)."""
        e = self.e
        names = dict(self.names)
        for k, v in enumerate(s.indirect):
            names[indirect_symbol(k)] = f"int64_t({e.emit(v)})"
        syms = {indirect_symbol(k) for k in range(len(s.indirect))}
        extents = var_ranges(self.k)
        idx = list(s.index)
        # a combo kernel's part writes only its own share of the space (and checks nothing else)
        mask = e.emit(s.mask) if s.mask is not None else None
        inside = [mask] if mask is not None else []
        for d, (ix, size) in enumerate(zip(s.index, buf.shape)):
            if not sympy.sympify(ix).free_symbols & syms:
                continue
            if ix in syms and proven_in_range(s.indirect[int(str(ix)[3:])], size, extents):
                continue
            at = e.fresh()
            e.line(f"const int64_t {at} = {ccode(ix, names)};")
            if checks_enabled() and self.bad_flag is not None:
                ok = e.fresh()
                e.line(f"const bool {ok} = uint64_t({at}) < uint64_t({ccode(size, self.names)});")
                e.line(f"{self.bad_flag} |= int64_t({'!' + ok if mask is None else f'{mask} && !{ok}'});")
                inside.append(ok)
            elif checks_enabled():
                e.helpers_used.add("tw_in_dim")
                inside.append(f"tw_in_dim({at}, int64_t({ccode(size, self.names)}), tw_err)")
            else:
                inside.append(f"({at} >= 0 && {at} < int64_t({ccode(size, self.names)}))")
            idx[d] = sympy.Symbol(at, integer=True)
            names[idx[d]] = at
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        element = f"{buf.name}[{ccode(offset(idx, strides), names)}]"
        kind = s.accumulate
        if kind is not None:
            ct = dtypes.compute_type(buf.dtype)
            old = e.load_value(element, buf.dtype)
            val = value if dtypes.compute_type(node.dtype) == ct else f"{CTYPE[ct]}({value})"
            if kind == "add":
                value = f"{CTYPE[ct]}({old} + {val})"
            elif kind in ("max", "min"):
                better = ">" if kind == "max" else "<"
                nan = f" || {val} != {val}" if dtypes.is_float(ct) else ""
                value = f"(({val} {better} {old}){nan}) ? {CTYPE[ct]}({val}) : {CTYPE[ct]}({old})"
            else:
                raise UnsupportedProblemError(f"C++ scatters do not combine by {kind!r}")
            node_dtype = ct
        else:
            node_dtype = node.dtype
        text = f"{element} = {e.store_value(value, node_dtype, buf.dtype)};"
        e.line(f"if ({' && '.join(inside)}) {text}" if inside else text)


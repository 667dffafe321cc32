"""The outer-reduction loop order of the C++ reduction template (``cpp.reduction`` with
``ORDER="outer"``): for a reduction over the outer dims of a row-major tensor, the output
elements x along the last output dim are contiguous and the reduced ones strided (the weight
gradient of a norm, ``sum(grad * normed, dim=(0, 1))``). Row order (x outermost) reads such a
row with a stride and splits the flat reduce index per element; this order loops r outermost
and a vectorised loop over a block of x innermost, each x element's accumulator in a buffer of
:data:`OUTER_WIDTH`, so every load is contiguous and the index arithmetic runs once per r.

Each x element's accumulator folds the row in order of r: a sum rounds as a sequential sum
(torch's own order differs; both are within fp32 tolerance of float64); max/min propagate NaN
as the row order does. Threads take tasks of one output row (every output dim but the last)
times a block of :data:`OUTER_WIDTH` along the last dim.

Only what this order computes exactly: one level of ``sum``/``prod``/``max``/``min``/``any``/
``all`` reductions (no Welford, argmax, scan or scatter, no gather, no reduction of a reduced
value), stores of per-x values after the pass, and of per-element values that read no reduced value
in the pass (the input of a norm's backward beside its weight gradient) (:func:`outer_refusal`).
"""

from __future__ import annotations

import sympy

from tilewright.ir import dtypes
from tilewright.ir.expr import load_indirect, toposort
from tilewright.ir.index import offset
from tilewright.ir.kernel import LoopKernel
from tilewright.templates.c_math import CTYPE

OUTER_WIDTH = 256  # x elements per task: one fp32 accumulator buffer of 1 KiB per reduction
OUTER_KINDS = ("sum", "prod", "max", "min", "any", "all")


def outer_refusal(kernel: LoopKernel) -> str | None:
    """Why the outer order cannot compute ``kernel`` exactly or would not pay, or None.

    It pays where the traced layout reads x contiguously: every load and store that varies
    along the last output dim steps by 1 along it, and some load varies along the reduction."""
    if kernel.kind != "reduction" or kernel.parts:
        return "the outer order runs one reduction kernel (not a pointwise or combo kernel)"
    if not kernel.ranges:
        return "the outer order needs an output dim to vectorise over"
    nodes = kernel.nodes()
    for n in nodes:
        if n.is_scan:
            return "the outer order has no scans"
        if n.op == "load" and (n.src or load_indirect(n)):
            return "the outer order reads no gathers or masked loads"
        if n.is_reduce:
            if n.arg not in OUTER_KINDS:
                return f"the outer order folds sum/prod/max/min/any/all, not {n.arg}"
            if any(m.is_reduce for m in toposort([n.src[0]])):
                return "the outer order computes one level of reductions (not a reduction of a reduced value)"
    r_vars = set(kernel.r_vars)
    inner = kernel.x_vars[-1]
    for s in kernel.stores:
        if s.is_scatter or s.mask is not None:
            return "the outer order stores no scatters or masked parts"
        along_r = kernel.depends_on_r(s.value) or any(sympy.sympify(e).free_symbols & r_vars for e in s.index)
        if along_r and any(m.is_reduce for m in toposort([s.value])):
            return "a value stored along the row reads a reduced value (row order computes it after its pass)"
    reads_r = False
    accesses = [(kernel.buffer(s.buffer), s.index) for s in kernel.stores]
    accesses += [(kernel.buffer(n.arg[0]), n.arg[1]) for n in nodes if n.op == "load"]
    for buf, idx in accesses:
        off = sympy.expand(offset(list(idx), list(buf.stride)))
        step = off.coeff(inner, 1)  # 1, and the rest free of it: a unit step along x (no Mod/floor of x)
        if inner in off.free_symbols and (step != 1 or inner in sympy.expand(off - step * inner).free_symbols):
            return f"{buf.name} is not contiguous along the last output dim (row order reads it better)"
        reads_r = reads_r or bool(off.free_symbols & r_vars)
    if not reads_r:
        return "nothing is read along the reduction"
    return None


def build_outer(body) -> None:
    """Write the outer-order body of ``body`` (a :class:`~tilewright.templates.cpp.loops._Body`
    of a kernel :func:`outer_refusal` accepts) into ``body.e.lines``: inside a task, the row's
    variables, the accumulators, the loop over r with a vectorised loop over ``[tw_lo, tw_hi)``
    inside (storing the per-element values), then a vectorised loop storing the per-x values."""
    from tilewright.templates.cpp.loops import _identity

    k, e = body.k, body.e
    inner = k.x_vars[-1]
    if len(k.ranges) > 1:
        body.decompose("tw_row", k.x_vars[:-1], k.ranges[:-1])
    dep_inner = body._depends([inner])
    dep_both = body._depends([inner, *k.r_vars])
    reduces = k.reductions()
    along_r = [s for s in k.stores if body.on_r(s)]
    in_pass = [r.src[0] for r in reduces] + [s.value for s in along_r]
    body.hoist(in_pass, dep_both)
    accs = []
    for r in reduces:
        ct = "bool" if r.arg in ("any", "all") else dtypes.compute_type(r.src[0].dtype)
        acc = e.fresh()
        e.line(f"{CTYPE[ct]} {acc}[{OUTER_WIDTH}];")
        e.line(f"for (int tw_l = 0; tw_l < {OUTER_WIDTH}; ++tw_l) {acc}[tw_l] = {_identity(r.arg, ct)};")
        accs.append((r, acc, ct))
    e.line("for (int64_t rindex = 0; rindex < rnumel; ++rindex) {")
    e.indent += "  "
    e.push()
    body.decompose("rindex", k.r_vars, k.reduction_ranges)
    body.hoist(in_pass, dep_inner)  # values of this r, the same for every x
    _open_columns(body, inner)
    for r, acc, _ in accs:
        body.update_accumulators(r, [acc], e.emit(r.src[0]))
    for s in along_r:  # values of the elements this pass reads (no reduced value among them)
        body.store(s, None)
    _close_columns(body)
    e.pop()
    e.indent = e.indent[:-2]
    e.line("}")
    _open_columns(body, inner)
    for r, acc, ct in accs:
        e.bind(r, body._as(f"{acc}[tw_l]", ct, r.dtype))
    for s in k.stores:
        if not any(s is t for t in along_r):
            body.store(s, None)
    _close_columns(body)


def _open_columns(body, inner: sympy.Symbol) -> None:
    e = body.e
    e.line("#pragma omp simd")
    e.line("for (int64_t tw_col = tw_lo; tw_col < tw_hi; ++tw_col) {")
    e.indent += "  "
    e.push()
    e.line("const int64_t tw_l = tw_col - tw_lo;")
    e.line(f"const int64_t {inner.name} = tw_col;")
    body.names[inner] = inner.name


def _close_columns(body) -> None:
    e = body.e
    e.pop()
    e.indent = e.indent[:-2]
    e.line("}")

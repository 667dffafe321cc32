"""What ``loops.cpp.jinja`` renders a C++ loop kernel from: one function per part of the kernel
(a combo kernel's parts run one after another), the entry that unpacks the launcher's arguments,
the helpers the bodies call and the C library's math they declare.

**The traced layout, specialised.** Every part's function is a template on ``TW_TRACED``: its
strides are the run-time arguments when false, and the layout traced (each buffer's strides as
expressions of the sizes, a literal 1 for the innermost dim of a contiguous tensor) when true.
The entry checks at run time that every tensor it was handed has the traced layout (a dim of
size 1 may have any stride) and calls the specialised instance then, the general one otherwise.
g++ only vectorises a load into one vector load when it knows the stride is 1: with run-time
strides it assembles each vector from scalar loads (measured: softmax's rows 3x slower).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir.kernel import LoopKernel
from tilewright.templates.cpp.runtime import MVEC
from tilewright.templates.cpp.emit import ERR_MEMORY, LIBM, STORAGE, CppExpr, ccode

LANES = 16  # partial accumulators per reduction: one 512-bit vector of fp32, or two 256-bit ones
PARALLEL_MIN_ELEMENTS = 32768  # below this a kernel runs on the calling thread only


def source_context(kernel: LoopKernel, persistent: bool, order: str = "row") -> dict[str, Any]:
    """The context of ``loops.cpp.jinja`` for ``kernel`` (reductions buffered per row when
    ``persistent``; r outermost where ``order`` is ``"outer"``, :mod:`.outer`): functions, the
    entry's unpacking and layout check, helpers, libm."""
    from tilewright.templates.cpp.loops import _Body
    from tilewright.templates.cpp.outer import OUTER_WIDTH, build_outer

    parts = kernel.parts or (kernel,)
    buffers = list(kernel.inputs) + list(kernel.outputs)
    out_names = {b.name for b in kernel.outputs}
    names = {s: s.name for s in kernel.size_symbols()}
    sizes = [s.name for s in kernel.size_symbols()]
    strides = [(b, d, f"{b.name}_s{d}") for b in buffers for d in range(len(b.shape))]
    params = [f"{'' if b.name in out_names else 'const '}{STORAGE[b.dtype]} *__restrict__ {b.name}" for b in buffers]
    params += [f"const int64_t a_{s}" for _, _, s in strides] + [f"const int64_t {s}" for s in sizes]
    params += ["const int64_t tw_nt", "const int64_t tw_block", "int64_t *tw_err"]
    args = [b.name for b in buffers] + [s for _, _, s in strides] + sizes + ["tw_nt", "tw_block", "tw_err"]
    # each function's first lines: its strides, traced or as handed
    layout = [f"const int64_t {s} = TW_TRACED ? int64_t({ccode(b.stride[d], names)}) : a_{s};"
              for b, d, s in strides]
    functions, helpers = [], set()
    for i, part in enumerate(parts):
        if order == "outer":
            body = _Body(part, False)
            build_outer(body)
            rows = part.ranges[:-1]
            functions.append(dict(name=f"tw_part{i}", kind="outer", lines=body.e.lines, caches=[],
                                  xnumel=ccode(part.xnumel, names), rnumel=ccode(part.rnumel, names),
                                  inner=ccode(part.ranges[-1], names), width=OUTER_WIDTH,
                                  rows=ccode(sympy.Mul(*rows), names) if rows else "1L"))
            helpers |= body.e.helpers_used
            continue
        body = _Body(part, persistent).build()
        # a scatter splits across threads only along its target's coordinates (rowops.py)
        split = dict(rows_parallel=body.plan.rows_parallel, inner_parallel=body.plan.inner_parallel)
        if part.kind == "reduction":
            functions.append(dict(name=f"tw_part{i}", kind="reduction", lines=body.e.lines, caches=body.caches,
                                  xnumel=ccode(part.xnumel, names), rnumel=ccode(part.rnumel, names), **split))
        else:
            rows = part.ranges[:-1]
            functions.append(dict(name=f"tw_part{i}", kind="pointwise", lines=body.e.lines, caches=[],
                                  inner=ccode(part.ranges[-1], names) if part.ranges else "1L",
                                  rows=ccode(sympy.Mul(*rows), names) if rows else "1L", **split))
        helpers |= body.e.helpers_used
    helper_text = CppExpr(load=lambda n: "")
    helper_text.helpers_used = helpers
    unpack = []
    for j, b in enumerate(buffers):
        const = "" if b.name in out_names else "const "
        unpack.append(f"{const}{STORAGE[b.dtype]} *{b.name} = reinterpret_cast<{const}{STORAGE[b.dtype]} *>(tw_args[{j}]);")
    for j, s in enumerate([s for _, _, s in strides] + sizes, start=len(buffers)):
        unpack.append(f"const int64_t {s} = tw_args[{j}];")
    traced = []
    for b, d, s in strides:
        if b.shape[d] == 1:
            continue  # a dim of one element: its stride is never multiplied by anything but 0
        cond = f"{s} == int64_t({ccode(b.stride[d], names)})"
        if not b.shape[d].is_number:
            cond = f"({cond} || int64_t({ccode(b.shape[d], names)}) == 1)"
        traced.append(cond)
    n = len(buffers) + len(strides) + len(sizes)
    return dict(kernel_name="tw_cpp_kernel", helpers=helper_text.helpers(), params=params, args=args,
                layout=layout, traced=traced or ["true"], functions=functions, unpack=unpack,
                knob_index={"block": n, "threads": n + 1}, parallel_min=PARALLEL_MIN_ELEMENTS, lanes=LANES,
                err_memory=ERR_MEMORY, libm=libm_declarations(), buffers=[b.name for b in buffers])


def libm_declarations() -> list[tuple[str, int]]:
    """(C declaration, libmvec level that gives it SIMD variants (0: none)) for every libm
    function the ops call, float and double."""
    level = {name: lv for lv, group in MVEC for name, _ in group}
    out = []
    for name, arity in LIBM.items():
        for t, suffix in (("float", "f"), ("double", "")):
            out.append((f"{t} {name}{suffix}({', '.join([t] * arity)});", level.get(name, 0)))
    return out

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

**The cost of a call.** The demo's kernels run for microseconds, so what a call does besides its
loops counts. Each part's loops are a function of its units (rows or tasks) ``[first, last)``:
on one thread the part calls it directly, without entering OpenMP (``GOMP_parallel`` makes a
team even for one thread); on several, each thread of the parallel region calls it with its
share. Row buffers live on the stack of the thread that runs the rows where the row is known
and fits :data:`STACK_ROW_BYTES` (no ``malloc``/``free`` a call). Measured on the demo's Llama
training step (one thread, one process, main's builds against these): 3.5-3.7 ms a step to
3.3-3.5 ms, its loop kernels 152 to 117 µs in isolation.
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir.kernel import LoopKernel
from tilewright.templates.cpp.runtime import MVEC
from tilewright.templates.cpp.emit import ERR_MEMORY, LIBM, STORAGE, CppExpr, ccode

LANES = 16  # partial accumulators per reduction: one 512-bit vector of fp32, or two 256-bit ones
PARALLEL_MIN_ELEMENTS = 32768  # below this a kernel runs on the calling thread only
# a pointwise row (last dim) known and at most this long is one task whatever the block: the
# block knob's smallest value (loops.py CppPointwise), so no block would have cut it
WHOLE_ROW_MAX = 256
# a part's row buffers (PERSISTENT caches, scan sums) of at most this many bytes a thread live on
# the stack of the thread running the rows: no malloc/free a call (a worker's stack is MiBs)
STACK_ROW_BYTES = 32 * 1024
_ITEMSIZE = {"double": 8, "float": 4, "int64_t": 8, "int32_t": 4, "int16_t": 2, "int8_t": 1,
             "uint8_t": 1, "bool": 1}


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
    # a part's own parameters, handed on to its loops (:file:`loops.cpp.jinja`)
    forward = [b.name for b in buffers] + [f"a_{s}" for _, _, s in strides] + sizes + ["tw_nt", "tw_block", "tw_err"]
    # each function's first lines: its strides, traced or as handed
    layout = [f"const int64_t {s} = TW_TRACED ? int64_t({ccode(b.stride[d], names)}) : a_{s};"
              for b, d, s in strides]
    functions, helpers = [], set()
    for i, part in enumerate(parts):
        xnumel, rnumel = ccode(part.xnumel, names), ccode(part.rnumel, names)
        rows = part.ranges[:-1]
        rows_text = ccode(sympy.Mul(*rows), names) if rows else "1L"
        inner = ccode(part.ranges[-1], names) if part.ranges else "1L"
        if order == "outer":
            body = _Body(part, False)
            build_outer(body)
            functions.append(dict(name=f"tw_part{i}", kind="outer", lines=body.e.lines, **_outer_space(
                xnumel, rnumel, rows_text, inner, OUTER_WIDTH)))
            helpers |= body.e.helpers_used
            continue
        body = _Body(part, persistent).build()
        # a scatter splits across threads only along its target's coordinates (rowops.py)
        split = dict(rows_parallel=body.plan.rows_parallel, inner_parallel=body.plan.inner_parallel)
        if part.kind == "reduction":
            functions.append(dict(name=f"tw_part{i}", kind="reduction", lines=body.e.lines, **split,
                                  **_reduction_space(xnumel, rnumel, part.rnumel, body.caches,
                                                     body.plan.rows_parallel)))
        else:
            functions.append(dict(name=f"tw_part{i}", kind="pointwise", lines=body.e.lines, **split,
                                  **_pointwise_space(rows_text, inner, _whole_row(part), **split)))
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
    return dict(kernel_name="tw_cpp_kernel", helpers=helper_text.helpers(), params=params, args=args, forward=forward,
                layout=layout, traced=traced or ["true"], functions=functions, unpack=unpack,
                knob_index={"block": n, "threads": n + 1}, parallel_min=PARALLEL_MIN_ELEMENTS, lanes=LANES,
                err_memory=ERR_MEMORY, libm=libm_declarations(), buffers=[b.name for b in buffers])


def _whole_row(part: LoopKernel) -> bool:
    """Whether a pointwise part's row (its last dim) is known and short enough to be one task
    whatever the block (:data:`WHOLE_ROW_MAX`)."""
    if not part.ranges:
        return True
    n = sympy.sympify(part.ranges[-1])
    return bool(n.is_number) and int(n) <= WHOLE_ROW_MAX


def _reduction_space(xnumel: str, rnumel: str, rnumel_expr: Any, caches: list[tuple[str, str]],
                     rows_parallel: bool) -> dict[str, Any]:
    """A row-order reduction part's sizes, its units (rows), when it runs on threads, and where
    its row buffers live: on the stack where the row is known and fits :data:`STACK_ROW_BYTES`
    (``stack``), on the heap, one row per thread, where it is known and does not (``heap``), or
    the stack when a run-time row fits and the heap otherwise (``either``)."""
    rn = sympy.sympify(rnumel_expr)
    row_bytes = sum(_ITEMSIZE[c] for _, c in caches)
    if not caches:
        mode, cap = "stack", 0
    elif rn.is_number and int(rn) * row_bytes <= STACK_ROW_BYTES:
        mode, cap = "stack", max(int(rn), 1)
    elif rn.is_number:
        mode, cap = "heap", 0
    else:
        mode, cap = "either", STACK_ROW_BYTES // row_bytes
    out = [dict(name=n, ctype=c, mode=mode, cap=cap) for n, c in caches]
    parallel = f"tw_nt > 1 && xnumel > 1 && xnumel * rnumel >= {PARALLEL_MIN_ELEMENTS}" if rows_parallel else "false"
    return dict(space=[f"const int64_t xnumel = {xnumel}, rnumel = {rnumel};", "(void)xnumel; (void)rnumel;"],
                units="xnumel", empty="xnumel <= 0", parallel=parallel, caches=out,
                heap=[c for c in out if mode != "stack"], stack_bytes=STACK_ROW_BYTES,
                on_heap="true" if mode == "heap" else f"rnumel > {cap}")


def _pointwise_space(rows: str, inner: str, inner_static: bool, rows_parallel: bool,
                     inner_parallel: bool) -> dict[str, Any]:
    """A pointwise part's sizes and units: tasks of ``tw_block`` elements of a row; whole rows
    (``whole``: the row loop's bounds then known to g++, no tail) where a scatter may write an
    element twice along the row or where the row is known and no longer than
    :data:`WHOLE_ROW_MAX`; blocks of the last dim, each over every row, where a scatter may
    write an element from two rows but not from two blocks."""
    space = [f"const int64_t tw_rows = {rows}, tw_inner = {inner};"]
    big = f"tw_rows * tw_inner >= {PARALLEL_MIN_ELEMENTS}"
    empty = "tw_rows <= 0 || tw_inner <= 0"
    if not rows_parallel and inner_parallel:
        space.append("const int64_t tw_blocks = (tw_inner + tw_block - 1) / tw_block;")
        return dict(space=space, units="tw_blocks", empty=empty, whole=False,
                    parallel=f"tw_nt > 1 && tw_blocks > 1 && {big}", caches=[], heap=[])
    if not inner_parallel or inner_static:
        parallel = f"tw_nt > 1 && tw_rows > 1 && {big}" if rows_parallel else "false"
        return dict(space=space, units="tw_rows", empty=empty, whole=True, parallel=parallel, caches=[], heap=[])
    space += ["const int64_t tw_width = tw_block;",
              "const int64_t tw_blocks = (tw_inner + tw_width - 1) / tw_width;",
              "const int64_t tw_tasks = tw_rows * tw_blocks;"]
    return dict(space=space, units="tw_tasks", empty=empty, whole=False,
                parallel=f"tw_nt > 1 && tw_tasks > 1 && {big}", caches=[], heap=[])


def _outer_space(xnumel: str, rnumel: str, rows: str, inner: str, width: int) -> dict[str, Any]:
    """An outer-order part's sizes and units: tasks of one output row times ``width`` elements
    of the last output dim (:mod:`.outer`)."""
    space = [f"const int64_t xnumel = {xnumel}, rnumel = {rnumel};", "(void)xnumel; (void)rnumel;",
             f"const int64_t tw_rows = {rows}, tw_inner = {inner}, tw_width = {width};",
             "const int64_t tw_blocks = (tw_inner + tw_width - 1) / tw_width;",
             "const int64_t tw_tasks = tw_rows * tw_blocks;"]
    return dict(space=space, units="tw_tasks", empty="tw_rows <= 0 || tw_inner <= 0",
                parallel=f"tw_nt > 1 && tw_tasks > 1 && xnumel * rnumel >= {PARALLEL_MIN_ELEMENTS}",
                caches=[], heap=[])


def libm_declarations() -> list[tuple[str, int]]:
    """(C declaration, libmvec level that gives it SIMD variants (0: none)) for every libm
    function the ops call, float and double."""
    level = {name: lv for lv, group in MVEC for name, _ in group}
    out = []
    for name, arity in LIBM.items():
        for t, suffix in (("float", "f"), ("double", "")):
            out.append((f"{t} {name}{suffix}({', '.join([t] * arity)});", level.get(name, 0)))
    return out

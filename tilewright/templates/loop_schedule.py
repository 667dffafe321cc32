"""The loop-kernel schedule, written once for every language: which statements a
:class:`~tilewright.problem.LoopProblem`'s kernel body is made of, and in what order.

A loop kernel is pointwise (one iteration space) or a row reduction (outer rows, each reducing
its ``rnumel`` elements). The schedule is the same in every language:

* **pointwise**: the outer variables from the flat index, then every store;
* **persistent rows** (the whole row at once: Triton's register block, Metal's threadgroup):
  the outer variables, the row's position, its variables, every store (reductions are computed
  inline, where a value needs one, by the emitter's ``reduce`` hook);
* **looped rows**: the outer variables; then one *pass* over the row per level of dependent
  reductions (softmax: the max, then the sum of ``exp(x - max)``), each pass declaring the
  level's accumulators, walking the row to update them, and combining them into the row's
  values; then the stores of per-row values (written once per row), and one more pass over the
  row for the stores of per-element values. Welford's mean and M2 of one value share one set
  of accumulators.

A *scan* (cumsum, cummax, ...: the IR's ``scan`` node) is a row operation whose value is per
element. Persistent rows compute it at once (the emitter's ``scan`` hook, :meth:`scan_inline`);
looped rows compute it in every walk over the row that needs it, carrying the running prefix
from one step to the next: its carry is declared before that loop (:meth:`init_scan`) and each
step combines its chunk's prefix with the carry and then advances it (:meth:`scan_step`).

A language subclasses :class:`LoopSchedule` and supplies the hooks (grouped below): how an
index variable is declared, how a loop over the row opens and closes, how a store is written,
how a reduction's accumulators start, take an element and finish, and its emitter
(:class:`~tilewright.ir.emitter.ExprEmitter`, with the ``load``/``index``/``reduce`` hooks). The
kernel text around the body (signature, program ids, launch) stays in the language's jinja file.
A scalar-per-element language (SYCL, Metal, FlyDSL, C++) has a thread or lane walk the row with
a stride; a block language (Triton) holds a block of the row per step; the schedule is the same.

Inductor shares one loop engine the same way (``torch/_inductor/codegen/simd.py``, subclassed
per language); this one is ours and much smaller: no tiling decisions, only statement order.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy

from tilewright.errors import UnsupportedProblemError
from tilewright.ir import dtypes
from tilewright.ir.bounds import guard_divisions
from tilewright.ir.emitter import ExprEmitter
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, toposort
from tilewright.ir.index import code, unflatten
from tilewright.ir.kernel import LoopKernel, Store


def needs_wide_index(problem: Any, limit: int) -> bool:
    """Whether a loop kernel's index arithmetic must be 64-bit: a dynamic problem (any size may
    come), or an element offset into some buffer, or the iteration space, beyond ``limit``
    (the largest value the language's 32-bit index math can hold safely)."""
    if problem.dynamic:
        return True
    sizes = problem.size_map
    for b in problem.kernel.inputs + problem.kernel.outputs:
        span = sum(max(int(s.xreplace(sizes)) - 1, 0) * abs(int(st.xreplace(sizes)))
                   for s, st in zip(b.shape, b.stride))
        if span > limit:
            return True
    return problem.xnumel * max(problem.rnumel, 1) > limit


def strided_scan_refusal(kernel: LoopKernel) -> str | None:
    """Why a language whose lanes walk a row with a stride (SYCL, Metal, FlyDSL: each lane sums
    every WG-th element, then the work-group combines) cannot render
    ``kernel``: a scan needs the row in order (a lane-parallel scan, not written for them yet),
    a scatter atomics; None when it has neither. A combo kernel is judged by its parts too (a
    scan in one part passed unseen and the C++ build raised "has no scans": fuzzer find)."""
    kernels = [kernel, *getattr(kernel, "parts", ())]
    if any(n.is_scan for k in kernels for n in k.nodes()):
        return ("scans (cumsum, cummax, ...) need the row in order and this language's lanes walk a row "
                "with a stride: the kernel runs on Triton or its torch form")
    if any(k.scatters() or any(b.init for b in k.outputs) for k in kernels):
        return ("scatters (index_put, scatter_add, ...) write through data-dependent indices with atomics, "
                "not written for this language yet: the kernel runs on Triton or its torch form")
    return None


class LoopSchedule:
    """The body of one loop kernel, built by :meth:`build` into ``self.e.lines``.

    Args:
        kernel: the loop kernel.
        persistent: rows held whole (:meth:`persistent_rows`) rather than looped over.
    """

    # integer division in :meth:`decompose` ("//" for Python-like languages, "/" for C-like)
    floordiv = "//"

    def __init__(self, kernel: LoopKernel, persistent: bool = False):
        # a division whose value nothing keeps divides by 1 (a cat's other lanes read 0)
        self.k = kernel = guard_divisions(kernel)
        self.reduction = kernel.kind == "reduction"
        self.persistent = persistent
        self.xvars, self.rvars = kernel.x_vars, kernel.r_vars
        self.names: dict[sympy.Symbol, str] = {s: s.name for s in kernel.size_symbols()}
        self.carries: dict[Node, list[str]] = {}  # a looped row's scans -> their carries
        self.e = self.make_emitter()

    # -- the schedule -----------------------------------------------------------------------------
    def build(self) -> "LoopSchedule":
        """Emit the whole body; returns self."""
        if not self.reduction:
            self.pointwise()
        elif self.persistent:
            self.persistent_rows()
        else:
            self.looped_rows()
        return self

    def pointwise(self) -> None:
        self.open_pointwise()
        self.decompose("xindex", self.xvars, self.k.ranges)
        for s in self.k.stores:
            self.store(s, None)
        self.close_pointwise()

    def persistent_rows(self) -> None:
        self.decompose("xindex", self.xvars, self.k.ranges)
        self.start_persistent_row()
        self.decompose("rindex", self.rvars, self.k.reduction_ranges)
        for s in self.k.stores:
            self.store(s, self.persistent_guard(s))

    def looped_rows(self) -> None:
        k = self.k
        self.decompose("xindex", self.xvars, k.ranges)
        reduces = k.reductions()
        level: dict[int, int] = {}
        for n in toposort(k.roots()):
            below = max((level.get(id(s), 0) for s in n.src), default=0)
            level[id(n)] = below + (1 if n.is_reduce else 0)
        for lv in sorted({level[id(r)] for r in reduces}):
            self.row_pass([r for r in reduces if level[id(r)] == lv])
        row_stores = [s for s in k.stores if not self.on_r(s)]
        element_stores = [s for s in k.stores if self.on_r(s)]
        if row_stores:
            self.write_row_stores(row_stores)
        if element_stores:
            self.open_row([s.value for s in element_stores] + [s.mask for s in element_stores if s.mask is not None]
                          + [v for s in element_stores for v in s.indirect])
            for s in element_stores:
                self.store(s, None)
            self.close_row()

    def row_pass(self, reduces: list[Node]) -> None:
        """One pass over the row computing ``reduces`` (their operands need only earlier
        levels): accumulators, the loop updating them, then each reduction's row value."""
        plan: list[tuple[Node, list[str], bool]] = []  # (reduction, accumulators, owns them)
        shared: dict[Any, list[str]] = {}
        for r in reduces:
            key = self.accumulator_group(r)
            if key in shared:
                plan.append((r, shared[key], False))
                continue
            accs = shared[key] = self.init_accumulators(r)
            plan.append((r, accs, True))
        self.open_row([r.src[0] for r in reduces])
        for r, accs, owner in plan:
            v = self.e.emit(r.src[0])
            if owner:
                self.update_accumulators(r, accs, v)
        self.close_row()
        for r, accs, owner in plan:
            self.e.bind(r, self.finish_accumulators(r, accs, owner))

    def open_row(self, roots: Sequence[Node] = ()) -> None:
        """Open a loop over the row and define its variables inside; the scans the loop will
        compute for ``roots`` (those not computed already) get their carries first."""
        self.carries = {}
        for n in toposort(roots, stop=lambda n: n in self.e.names):
            if n.is_scan and n not in self.e.names:
                self.carries[n] = self.init_scan(n)
        rindex, suffix = self.open_row_loop()
        self.decompose(rindex, self.rvars, self.k.reduction_ranges, suffix)

    def close_row(self) -> None:
        self.close_row_loop()

    # -- shared pieces ----------------------------------------------------------------------------
    def decompose(self, flat: str, vars_: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr],
                  suffix: str = "") -> None:
        """Lines defining each used variable from the flat index (row-major). A ``suffix``
        gives a loop's variables names of their own."""
        for v, text in unflatten(flat, vars_, ranges, self.k.used_vars(), self.index_code, self.floordiv):
            name = f"{v.name}{suffix}"
            self.e.line(self.declare_index(name, text))
            self.names[v] = name

    def store(self, s: Store, guard: str | None) -> None:
        """Store ``s``'s value, rounded once (a cast to the buffer's own float type is the
        store's rounding), under ``guard`` (a condition in the language, or None)."""
        buf = self.k.buffer(s.buffer)
        node = s.value
        if node.op == "cast" and node.dtype == buf.dtype and dtypes.is_float(node.dtype):
            node = node.src[0]
        self.write_store(s, buf, node, self.e.emit(node), guard)

    def on_r(self, s: Store) -> bool:
        """Whether a store's value, its mask or where it writes varies along the row: stored
        per element. A row value written along the row (``sum(...)`` expanded over an empty
        row: SDPA with batch 0) is per element too; masked by ``xmask`` alone, its lane 0
        wrote into a buffer of no elements (exit 139)."""
        r_vars = set(self.k.r_vars)
        return self.reduction and (self.k.depends_on_r(s.value)
                                   or s.mask is not None and self.k.depends_on_r(s.mask)
                                   or any(self.k.depends_on_r(v) for v in s.indirect)
                                   or any(sympy.sympify(e).free_symbols & r_vars for e in s.index))

    def deps(self, exprs) -> tuple[bool, bool]:
        """Whether index expressions read the outer and the reduction variables."""
        free: set[sympy.Symbol] = set()
        for e in exprs:
            free |= sympy.sympify(e).free_symbols
        return bool(free & set(self.xvars)), bool(free & set(self.rvars))

    def node_deps(self, node: Node) -> tuple[bool, bool]:
        """Whether a value varies along the outer and the reduction variables. A reduction's
        result is one value per row: what it reads along the row does not make it vary there
        (a gather at a row's argmax is a row load, masked by ``xmask`` alone)."""
        if node.is_reduce:
            return self.node_deps(node.src[0])[0], False
        has_x = has_r = False
        for m in toposort([node], stop=lambda m: m.is_reduce):
            if m.is_reduce:
                has_x = has_x or self.node_deps(m.src[0])[0]
                continue
            if m.op == "load":
                hx, hr = self.deps(m.arg[1])
            elif m.op == "index":
                hx, hr = self.deps([m.arg])
            else:
                continue
            has_x, has_r = has_x or hx, has_r or hr
        return has_x, has_r

    def load_names(self, n: Node, wrap: str = "{}") -> dict[sympy.Symbol, str]:
        """Names for printing a load's index: the sizes, and a gather's indices as the values
        computed for them (``wrap`` formats each, e.g. a cast to the index type)."""
        names = dict(self.names)
        for i, v in enumerate(load_indirect(n)):
            names[indirect_symbol(i)] = wrap.format(self.e.names[v])
        return names

    # -- hooks: the language ----------------------------------------------------------------------
    def make_emitter(self) -> ExprEmitter:
        """The language's expression emitter, its ``load``/``index``/``reduce`` hooks bound to
        this schedule's methods."""
        raise NotImplementedError

    def index_code(self, e: sympy.Expr) -> str:
        """An integer index expression in the language (sizes by their names)."""
        return code(e, self.names)

    def declare_index(self, name: str, text: str) -> str:
        """The statement defining index variable ``name`` as ``text``."""
        return f"{name} = {text}"

    def open_pointwise(self) -> None:
        """Before a pointwise body (a grid-stride loop where the language has one)."""

    def close_pointwise(self) -> None:
        """After a pointwise body."""

    def start_persistent_row(self) -> None:
        """Define ``rindex`` and ``rmask`` for a row held whole (persistent languages only)."""
        raise UnsupportedProblemError(f"{type(self).__name__} holds no whole rows: loop over them")

    def persistent_guard(self, s: Store) -> str | None:
        """The condition a store of a persistent row runs under (None: the store masks itself)."""
        return None

    def open_row_loop(self) -> tuple[str, str]:
        """Open a loop over the row (lines, indentation, a new scope); returns the flat row
        index's name and a suffix for the row variables (or "")."""
        raise NotImplementedError

    def close_row_loop(self) -> None:
        """Close the loop :meth:`open_row_loop` opened."""
        raise NotImplementedError

    def write_store(self, s: Store, buf, node: Node, value: str, guard: str | None) -> None:
        """The statement(s) storing ``value`` (the code of ``node``) into ``buf`` at ``s.index``,
        under ``guard`` and the store's own ``mask`` (a combo kernel part's share)."""
        raise NotImplementedError

    def write_row_stores(self, stores: list[Store]) -> None:
        """Stores of per-row values after the passes (once per row: by one lane where lanes
        share a row)."""
        for s in stores:
            self.store(s, None)

    # -- hooks: reductions in a looped row --------------------------------------------------------
    def accumulator_group(self, r: Node) -> Any:
        """Reductions with equal groups share accumulators: Welford's mean and M2 of one value."""
        return ("welford", id(r.src[0])) if r.arg.startswith("welford") else id(r)

    def init_accumulators(self, r: Node) -> list[str]:
        """Declare reduction ``r``'s accumulators (before the row loop); their names."""
        raise NotImplementedError

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        """Fold one element ``v`` (inside the row loop) into the accumulators."""
        raise NotImplementedError

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        """Combine the accumulators into the row's value of ``r`` (after the loop; across lanes
        where lanes share a row); returns its code. ``owner``: the first reduction of its
        accumulator group (the others take their value from the same combine)."""
        raise NotImplementedError

    # -- hooks: scans --------------------------------------------------------------------------
    def scan_value(self, n: Node, v: str) -> str:
        """The emitter's ``scan`` hook: the whole row's prefix at once in a persistent row, one
        step of it (with its carry) in a looped one."""
        if self.persistent:
            return self.scan_inline(n, v)
        if n not in self.carries:
            raise UnsupportedProblemError("a scan outside a row loop (the schedule declares its carry first)")
        return self.scan_step(n, v, self.carries[n])

    def scan_inline(self, n: Node, v: str) -> str:
        """The prefix of a row held whole (persistent languages)."""
        raise UnsupportedProblemError(f"{type(self).__name__} has no scans")

    def init_scan(self, n: Node) -> list[str]:
        """Declare scan ``n``'s carry before a row loop (the identity of its combine); its names."""
        raise UnsupportedProblemError(f"{type(self).__name__} has no scans")

    def scan_step(self, n: Node, v: str, carries: list[str]) -> str:
        """Inside the row loop: the prefix at this step's elements (``v`` their values) from the
        carry, then the carry advanced past the step; returns the code of the prefix."""
        raise UnsupportedProblemError(f"{type(self).__name__} has no scans")

    def reduce_inline(self, n: Node, v: str) -> str:
        """The emitter's ``reduce`` hook: a reduction of a persistent row, computed where a
        value needs it. Looped rows bind every reduction in its pass, so never get here."""
        raise UnsupportedProblemError("a reduction outside its pass (the schedule binds every reduction first)")

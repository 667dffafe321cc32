"""Metal templates for loop kernels (:class:`~tilewright.problem.LoopProblem`) on the ``mps``
target: ``metal.pointwise`` and ``metal.reduction``.

Pointwise: one thread per element, grid-stride (the grid is capped at a few threadgroups per
GPU core, so each thread walks ``xnumel / threads`` elements). Reduction: one threadgroup per
row (``xindex`` = the threadgroup's position); each thread combines its share of the row, then
:mod:`tilewright.templates.metal.reduce` combines across the threadgroup. ``PERSISTENT``: the
row fits the threadgroup (``rnumel <= threads``), one element per thread, held in registers
across dependent reductions (softmax's max, then its sum); otherwise the row is looped over in
threadgroup-sized steps, one pass per level of dependent reductions and one more for values
stored per element (Welford's online update for mean/variance).

Loads and stores index buffers through run-time strides, sizes and element counts, passed in
one ``constant long*`` array after the tensors (Metal allows 31 buffer arguments, so one per
stride would run out). Each rendered kernel is a Python module: the shader text (``SHADER``),
its launch geometry (``grid``) and ``launch``, which on macOS compiles the shader once with
``torch.mps.compile_shader`` and calls ``lib.<kernel>(*tensors, meta, threads=...,
group_size=...)``; elsewhere it refuses in one line (see
:func:`tilewright.templates.metal.check.require_metal_runtime`).
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir import dtypes
from tilewright.ir.bounds import checks_enabled, unchecked_dims
from tilewright.ir.expr import Node, load_indirect, load_mask
from tilewright.ir.index import code, offset
from tilewright.ir.kernel import LoopKernel, Store
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.c_loops import CFamilyBody
from tilewright.templates.loop_schedule import needs_wide_index, strided_scan_refusal
from tilewright.templates.metal.emit import (
    HELPERS, MSL_TYPE, MetalExpr, ctype, index_code, unsupported_dtype, zero,
)
from tilewright.templates.metal.limits import threadgroup_refusal
from tilewright.templates.metal.reduce import SIMD_WIDTH, Reduction

INT32_MAX = 2**31 - 1
# 32-bit indices below this: a grid-stride step (at most the grid, well under 2**24 threads) past
# the last element must not wrap either
INDEX_LIMIT = INT32_MAX - 2**24
MAX_THREADS_PER_GROUP = 1024  # Metal's limit per threadgroup on Apple GPUs
MAX_BUFFERS = 31  # Metal's buffer argument table
# pointwise grid cap: threadgroups per GPU core (enough resident work to hide latency; beyond
# it threads loop over the elements)
GROUPS_PER_CORE = 8


def needs_int64(problem: LoopProblem) -> bool:
    """64-bit index math when a buffer may span about 2**31 elements (always for dynamic sizes)."""
    return needs_wide_index(problem, INDEX_LIMIT)


class _Body(CFamilyBody):
    """The loop schedule in MSL: one thread per element (pointwise, grid-stride) or a
    threadgroup per row, combined by :mod:`tilewright.templates.metal.reduce`."""

    floordiv = "/"

    def __init__(self, kernel: LoopKernel, idx: str, threads: int, persistent: bool):
        self.idx = idx  # "int" or "long": the index type
        self.threads = threads
        self.reductions: dict[str, Reduction] = {}  # helper name -> reduction (rendered once)
        self.slots: dict[tuple[str, int], int] = {}  # (MSL type, size) -> arrays needed at once
        self.welford: dict[int, tuple[str, str]] = {}
        self.in_loop = False  # inside a loop over the row: every element is in range
        super().__init__(kernel, persistent)

    INDEX, INDEX_ZERO = "long", "0L"  # a checked index is computed in 64 bits

    def ccode(self, e: Any, names: dict) -> str:
        return index_code(e, names)

    def make_emitter(self) -> MetalExpr:
        e = MetalExpr(load=self._load, index=self._index, reduce=self.reduce_inline)
        e.checked = self._checked
        return e

    # -- values ---------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        indirect = load_indirect(n)
        strides = [sympy.Symbol(f"{name}_s{d}") for d in range(len(buf.shape))]
        names = self.load_names(n)
        idx = list(idx)
        # gathered dims: checked against their dim, not read out of it (unless proven in range)
        for d in unchecked_dims(self.k, n, idx) if checks_enabled() else ():
            e = idx[d]
            checked = self.e.fresh()
            self.e.helpers_used.add("tw_index")
            at = f"long({index_code(e, names)})"
            if load_mask(n) is not None:  # a masked-off lane's index may be anything: it reads nothing
                at = f"({self.e.names[load_mask(n)]} ? {at} : 0L)"
            self.e.line(f"const {self.idx} {checked} = static_cast<{self.idx}>("
                        f"tw_index({at}, long({index_code(buf.shape[d], self.names)}), tw_err));")
            idx[d] = sympy.Symbol(checked, integer=True)
            names[idx[d]] = checked
        off = index_code(offset(idx, strides), names)
        value = f"{name}[{off}]"
        if buf.dtype != "bool":
            value = f"static_cast<{ctype(n.dtype)}>({value})"
        guards = []
        # a persistent row's threads past its end must not read: the address may be outside
        if self.reduction and self.persistent and not self.in_loop and (
                self.deps(idx)[1] or any(self.k.depends_on_r(v) for v in indirect)):
            guards.append("rmask")
        own = load_mask(n)
        if own is not None:  # a masked load (cat, pad): only where the mask holds
            guards.append(self.e.names[own])
        if not guards:
            return value
        return f"(({' && '.join(guards)}) ? {value} : {zero(n.dtype)})"

    def _index(self, n: Node) -> str:
        return f"static_cast<{ctype(n.dtype)}>({index_code(n.arg, self.names)})"

    def _reduction_of(self, n: Node) -> Reduction:
        kind = "welford" if n.arg.startswith("welford") else n.arg
        red = Reduction(kind, dtypes.compute_type(n.src[0].dtype))
        if red.name not in self.reductions:
            self.reductions[red.name] = red
        need: dict[tuple[str, int], int] = {}
        for slot in red.slots(self.threads):
            need[slot] = need.get(slot, 0) + 1
        for slot, count in need.items():
            self.slots[slot] = max(self.slots.get(slot, 0), count)
        return red

    def _arrays(self, red: Reduction) -> list[str]:
        used: dict[tuple[str, int], int] = {}
        out = []
        for t, size in red.slots(self.threads):
            j = used.get((t, size), 0)
            used[(t, size)] = j + 1
            out.append(self.slot_name(t, size, j))
        return out

    def slot_name(self, t: str, size: int, j: int) -> str:
        return f"tw_tg_{t}{'' if size == SIMD_WIDTH else '_t'}{j}"

    def _call(self, red: Reduction, accs: list[str]) -> None:
        self.e.line(f"{red.name}({', '.join(accs + self._arrays(red))}, tid, lane, sg, nsg, ntg);")

    def reduce_inline(self, n: Node, v: str) -> str:
        """Persistent rows: this thread's element (or the identity past the row's end), then
        the threadgroup combine."""
        if not self.persistent:
            raise AssertionError("looped reductions are computed by row_pass, not inline")
        if n.arg.startswith("welford"):
            mean, m2 = self._welford_persistent(n.src[0], v)
            return mean if n.arg == "welford_mean" else m2
        red = self._reduction_of(n)
        ident = red.identity()
        accs = [self.e.fresh() for _ in red.types]
        types = red.msl_types
        if red.kind in ("argmax", "argmin"):
            self.e.line(f"{types[0]} {accs[0]} = rmask ? {v} : {ident[0]};")
            self.e.line(f"{types[1]} {accs[1]} = rmask ? static_cast<int>(rindex) : {ident[1]};")
            self._call(red, accs)
            return f"static_cast<long>({accs[1]})"
        value = f"({v} != 0)" if red.kind in ("any", "all") and n.src[0].dtype != "bool" else v
        self.e.line(f"{types[0]} {accs[0]} = rmask ? {value} : {ident[0]};")
        self._call(red, accs)
        return accs[0]

    def _welford_persistent(self, src: Node, v: str) -> tuple[str, str]:
        """The exact two-pass mean and M2 of a row held in registers."""
        if id(src) not in self.welford:
            red = self._reduction_of_sum()
            mean, m2 = self.e.fresh(), self.e.fresh()
            self.e.line(f"float {mean} = rmask ? {v} : 0.0f;")
            self._call(red, [mean])
            self.e.line(f"{mean} = {mean} / static_cast<float>(rnumel);")
            self.e.line(f"float {m2} = rmask ? ({v} - {mean}) * ({v} - {mean}) : 0.0f;")
            self._call(red, [m2])
            self.welford[id(src)] = (mean, m2)
        return self.welford[id(src)]

    def _reduction_of_sum(self) -> Reduction:
        red = Reduction("sum", "fp32")
        self.reductions.setdefault(red.name, red)
        slot = red.slots(self.threads)[0]
        self.slots[slot] = max(self.slots.get(slot, 0), 1)
        return red

    # -- statements -----------------------------------------------------------------------------
    def declare_index(self, name: str, text: str) -> str:
        return f"const {self.idx} {name} = {text};"

    def write_store(self, s: Store, buf, node: Node, value: str, guard: str | None) -> None:
        """``buffer[index] = value``, under ``guard`` and the store's own mask (a combo part's
        share). The value is computed before the conditional: it may hold a threadgroup
        reduction, whose barriers every thread must reach."""
        conds = [guard] if guard else []
        if s.mask is not None:
            conds.append(self.e.emit(s.mask))
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = index_code(offset(s.index, strides), self.names)
        line = f"{buf.name}[{off}] = {self.e.store_value(value, node.dtype, buf.dtype)};"
        self.e.line(f"if ({' && '.join(conds)}) {line}" if conds else line)

    def write_row_stores(self, stores: list[Store]) -> None:
        for s in stores:
            self.store(s, "tid == 0")

    def open_pointwise(self) -> None:
        self.e.open(f"for ({self.idx} xindex = gid; xindex < xnumel; xindex += gsize)")

    def close_pointwise(self) -> None:
        self.e.close()

    def start_persistent_row(self) -> None:
        self.e.line(f"const {self.idx} rindex = tid;")
        self.e.line("const bool rmask = rindex < rnumel;")

    def persistent_guard(self, s: Store) -> str | None:
        return "rmask" if self.on_r(s) else "tid == 0"

    def open_row_loop(self) -> tuple[str, str]:
        self.e.open(f"for ({self.idx} rindex = tid; rindex < rnumel; rindex += ntg)")
        self.in_loop = True
        return "rindex", ""

    def close_row_loop(self) -> None:
        self.e.close()
        self.in_loop = False

    # -- looped reductions: a partial per thread, then the threadgroup helper ---------------------
    def init_accumulators(self, r: Node) -> list[str]:
        red = self._reduction_of(r)
        if red.kind == "welford":
            accs = [self.e.fresh() for _ in range(3)]  # mean, M2, count
            for a in accs:
                self.e.line(f"float {a} = 0.0f;")
            return accs
        accs = [self.e.fresh() for _ in red.types]
        for t, a, ident in zip(red.msl_types, accs, red.identity()):
            self.e.line(f"{t} {a} = {ident};")
        return accs

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        red = self._reduction_of(r)
        if red.kind == "welford":  # Welford's online update of this thread's elements
            self.e.line(f"{accs[2]} += 1.0f;")
            self.e.open("")
            self.e.line(f"const float delta = {v} - {accs[0]};")
            self.e.line(f"{accs[0]} += delta / {accs[2]};")
            self.e.line(f"{accs[1]} += delta * ({v} - {accs[0]});")
            self.e.close()
            return
        if red.kind in ("argmax", "argmin"):
            b = [v, "static_cast<int>(rindex)"]
        elif red.kind in ("any", "all") and r.src[0].dtype != "bool":
            b = [f"({v} != 0)"]
        else:
            b = [v]
        self.e.open("")
        bn = [f"b{i}" for i in range(len(b))]
        for t, name, val in zip(red.msl_types, bn, b):
            self.e.line(f"const {t} {name} = {val};")
        for st in red.combine(accs, bn):
            self.e.line(st)
        self.e.close()

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        red = self._reduction_of(r)
        if owner:
            self._call(red, accs)
        if red.kind == "welford":
            return accs[0] if r.arg == "welford_mean" else accs[1]
        return f"static_cast<long>({accs[1]})" if red.kind in ("argmax", "argmin") else accs[0]

    # -- what the shader declares -----------------------------------------------------------------
    def smem_bytes(self) -> int:
        return sum(count * size * _MSL_SIZE[t] for (t, size), count in self.slots.items())

    def smem_decls(self) -> list[str]:
        return [f"threadgroup {t} {self.slot_name(t, size, j)}[{size}];"
                for (t, size), count in sorted(self.slots.items()) for j in range(count)]

    def helpers(self) -> str:
        parts = [self.e.helpers()] if self.e.helpers_used else []
        needs_minmax = any(r.kind in ("max", "min") and dtypes.is_float(r.dtype) for r in self.reductions.values())
        if needs_minmax:  # the reduction combine uses the NaN-propagating helpers
            for h in ("tw_max", "tw_min"):
                if h not in self.e.helpers_used:
                    parts.append(HELPERS[h].strip("\n"))
        parts += [r.helper() for _, r in sorted(self.reductions.items())]
        return "\n\n".join(parts)


_MSL_SIZE = {MSL_TYPE[k]: v for k, v in dtypes.ITEMSIZE.items() if k in MSL_TYPE}


def launch_geometry(kind: str, xnumel: int, threads: int, target: Target) -> tuple[int, int]:
    """(threads in the grid, threads per threadgroup) for a launch: pointwise, one thread per
    element up to ``GROUPS_PER_CORE`` threadgroups per GPU core (a grid-stride loop does the
    rest); reduction, one threadgroup of ``threads`` per row."""
    if kind == "reduction":
        return xnumel * threads, threads
    cap = target.num_sms * GROUPS_PER_CORE * threads
    return max(1, min(xnumel, cap)), threads


class _MetalLoops(TemplateSpec):
    backend = "metal"
    jinja = "loops.metal.jinja"
    launcher = "launcher.py.jinja"

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if target.backend != "mps":
            return Support(False, "Metal kernels run on the mps target only")
        if (why := strided_scan_refusal(problem.kernel)) is not None:
            return Support(False, why)
        k = problem.kernel
        for b in k.inputs + k.outputs:
            if (why := unsupported_dtype(b.dtype)) is not None:
                return Support(False, f"{b.name}: {why}")
        for n in k.nodes():
            if (why := unsupported_dtype(dtypes.compute_type(n.dtype))) is not None:
                return Support(False, why)
        if len(k.inputs) + len(k.outputs) + 1 > MAX_BUFFERS:
            return Support(False, f"{len(k.inputs) + len(k.outputs)} tensors and the size array exceed "
                                  f"Metal's {MAX_BUFFERS} buffer arguments: split the kernel")
        if problem.kind == "reduction" and problem.rnumel > INT32_MAX:
            return Support(False, "a row over 2**31 elements (positions are 32-bit in the combine)")
        return SUPPORTED

    def threads(self, params: Params) -> int:
        return int(params["num_warps"]) * SIMD_WIDTH

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        # the thread limit first: a pointwise kernel has no threadgroup memory; a reduction's
        # is checked in check_tile, which builds the body to count it
        if (why := threadgroup_refusal(self.threads(params), 0, target,
                                       fewer_threads="lower num_warps", less_memory="")) is not None:
            return why
        return self.check_tile(params, problem, target)

    def check_tile(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        return None

    def _body(self, problem: LoopProblem, params: Params) -> _Body:
        threads = self.threads(params)
        return _Body(problem.kernel, "long" if needs_int64(problem) else "int", threads,
                     bool(params.get("PERSISTENT", False))).build()

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        k = problem.kernel
        body = self._body(problem, params)
        names = {s: s.name for s in k.size_symbols()}
        buffers = list(k.inputs) + list(k.outputs)
        strides = [f"{b.name}_s{d}" for b in buffers for d in range(len(b.shape))]
        sizes = [s.name for s in k.size_symbols()]
        reduction = problem.kind == "reduction"
        meta = strides + sizes + ["xnumel"] + (["rnumel"] if reduction else [])
        kernel_name = f"tw_{problem.kind}"
        args = [f"device const {MSL_TYPE[b.dtype]}* {b.name} [[buffer({i})]]" for i, b in enumerate(k.inputs)]
        args += [f"device {MSL_TYPE[b.dtype]}* {b.name} [[buffer({len(k.inputs) + i})]]"
                 for i, b in enumerate(k.outputs)]
        args.append(f"constant long* meta [[buffer({len(buffers)})]]")
        err_flag = "tw_index" in body.e.helpers_used  # gathers report an index out of range here
        if err_flag:
            args.append(f"device int* tw_err [[buffer({len(buffers) + 1})]]")
        if reduction:
            args += ["uint xid [[threadgroup_position_in_grid]]", "uint tid [[thread_position_in_threadgroup]]",
                     "uint ntg [[threads_per_threadgroup]]", "uint lane [[thread_index_in_simdgroup]]",
                     "uint sg [[simdgroup_index_in_threadgroup]]", "uint nsg [[simdgroups_per_threadgroup]]"]
        else:
            args += ["uint gid [[thread_position_in_grid]]", "uint gsize [[threads_per_grid]]"]
        threads = self.threads(params)
        shader = self.render_jinja(
            problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name,
            kernel_name=kernel_name, args=args, meta=meta, idx=body.idx, reduction=reduction,
            helpers=body.helpers(), smem=body.smem_decls(), body=body.e.lines,
        )
        cap = target.num_sms * GROUPS_PER_CORE * threads
        launcher = self.render_jinja_file(
            self.launcher, problem_text=problem.describe(), params_text=self.space.encode(params),
            target=target.name, shader=shader, kernel_name=kernel_name, reduction=reduction,
            persistent=body.persistent,
            inputs=[b.name for b in k.inputs], sizes=sizes, buffers=[b.name for b in buffers],
            outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]),
                      "shape": [code(s, names) for s in b.shape], "stride": [code(s, names) for s in b.stride]}
                     for b in k.outputs],
            xnumel=code(k.xnumel, names), rnumel=code(k.rnumel, names), threads=threads, grid_cap=cap,
            err_flag=err_flag,
        )
        grid, group = launch_geometry(problem.kind, problem.xnumel, threads, target)
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=launcher,
            name=f"metal_{problem.kind}",
            meta={"kind": problem.kind, "shader": shader, "kernel": kernel_name, "meta_args": meta,
                  "threads": grid, "group_size": group, "threadgroup_bytes": body.smem_bytes(),
                  "persistent": body.persistent})



class MetalPointwise(_MetalLoops):
    """Pointwise kernels: one thread per element, grid-stride."""

    id = "metal.pointwise"
    op = "pointwise"
    space = ParamSpace((
        Knob("num_warps", (1, 2, 4, 8, 16, 32), 8, "simdgroups (32 threads each) per threadgroup"),
    ))

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        n = max(problem.xnumel, 1)
        out = []
        for threads in (128, 256, 512, 1024):
            warps = max(1, min(threads, 1 << max(n - 1, 0).bit_length()) // SIMD_WIDTH)
            if {"num_warps": warps} not in out:
                out.append({"num_warps": warps})
        return out


class MetalReduction(_MetalLoops):
    """Reduction kernels: one threadgroup per row; the row in registers (``PERSISTENT``) or
    looped over in threadgroup-sized steps."""

    id = "metal.reduction"
    op = "reduction"
    space = ParamSpace((
        Knob("XBLOCK", (1,), 1, "rows per threadgroup"),
        Knob("num_warps", (1, 2, 4, 8, 16, 32), 8, "simdgroups (32 threads each) per threadgroup"),
        Knob("PERSISTENT", (False, True), True, "one element per thread, the row held in registers"),
    ))

    def check_tile(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        threads = self.threads(params)
        r = max(problem.rnumel, 1)
        if params["PERSISTENT"] and r > threads:
            return (f"a persistent row of {r} elements needs {r} threads, over the {threads} of "
                    f"this threadgroup: loop over the row (PERSISTENT=False) or use more simdgroups")
        if not params["PERSISTENT"] and threads >= 2 * r:
            return f"a threadgroup of {threads} threads is over twice the row ({r}): use the persistent form"
        if problem.xnumel * threads > 2**32 - 1:
            return f"{problem.xnumel} rows of {threads} threads exceed Metal's 32-bit grid"
        body = self._body(problem, params)
        return threadgroup_refusal(threads, body.smem_bytes(), target, fewer_threads="lower num_warps",
                                   less_memory="the reductions' partials need fewer threads (lower num_warps)")

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        r = max(problem.rnumel, 1)
        row = max(SIMD_WIDTH, 1 << max(r - 1, 0).bit_length())
        out = []
        if row <= min(MAX_THREADS_PER_GROUP, target.max_threads_per_block):
            out.append({"XBLOCK": 1, "num_warps": row // SIMD_WIDTH, "PERSISTENT": True})
        if r >= 512:  # long rows: the looped form beside (or instead of) the persistent one
            for threads in (256, 512, 1024):
                if threads < 2 * r and threads <= target.max_threads_per_block:
                    out.append({"XBLOCK": 1, "num_warps": threads // SIMD_WIDTH, "PERSISTENT": False})
        return out

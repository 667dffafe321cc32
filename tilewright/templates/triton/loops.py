"""Triton templates for loop kernels (:class:`~tilewright.problem.LoopProblem`): pointwise and
reduction, on every Triton target and the interpreter.

Pointwise: one program per ``XBLOCK`` elements of the flattened iteration space. Reduction:
``XBLOCK`` rows per program, each row's ``rnumel`` elements either held at once
(``PERSISTENT``: ``RBLOCK`` is the row rounded up to a power of two, one pass, everything in
registers) or walked ``RBLOCK`` at a time (looped: one pass per level of dependent reductions,
softmax's max then sum, and one more for the values stored per element). The body comes from
the IR's Triton emitter (:mod:`tilewright.templates.triton.emit`); loads and stores index
buffers through run-time strides, so any layout is read correctly.
"""

from __future__ import annotations

from typing import Any

import sympy

from tilewright.ir import dtypes
from tilewright.ir.bounds import INT_DIVISIONS, check_needed, checks_enabled, unchecked_dims, var_ranges
from tilewright.ir.expr import Node, load_indirect, load_mask
from tilewright.ir.index import code, offset
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.templates.base import (
    SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)
from tilewright.templates.loop_schedule import LoopSchedule, needs_wide_index
from tilewright.templates.triton.rowops import SCAN_HELPERS, RowOpsHooks, atomic_refusal
from tilewright.templates.triton.pdl import GDC_IMPORT, PDL_KNOB, pdl_checks, pdl_refusal, signal_before_stores
from tilewright.templates.triton.emit import POINTER, TL_DTYPE, TritonExpr
from tilewright.templates.triton.descriptors import MIN_DESC_RBLOCK, DescriptorPlan, plan_descriptors

INT32_MAX = 2**31 - 1
# what a kernel with bounds checks is compiled with: Triton keeps tl.device_assert only with
# debug on, and debug alone would also add its int32 overflow asserts (torch's integers wrap)
ASSERT_OPTIONS = {"debug": True, "sanitize_overflow": False}

def _bound(dt: str, lowest: bool) -> str:
    """A max (lowest) or min reduction's identity in ``dt``: the type's own range, so a uint8 or
    int16 fill fits its type (2**31 - 1 does not: Triton refuses the kernel)."""
    v = dtypes.extreme(dt, lowest)
    return f"float('{v}')" if isinstance(v, float) else str(int(v))


# reduction kind -> its identity as a function of the compute dtype
_IDENTITY = {
    "sum": lambda dt: "0", "prod": lambda dt: "1",
    "max": lambda dt: _bound(dt, True), "min": lambda dt: _bound(dt, False),
    "any": lambda dt: "0", "all": lambda dt: "1",
}
_COMBINE_HELPERS = '''
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _or_combine(a, b):
    return a | b


@triton.jit
def _and_combine(a, b):
    return a & b


@triton.jit
def _argmax_combine(a, ia, b, ib):
    # the larger value wins, NaN counting as the largest; ties go to the lower index (torch)
    take_a = (a > b) | ((a == b) & (ia < ib)) | ((a != a) & ((b == b) | (ia < ib)))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


@triton.jit
def _argmin_combine(a, ia, b, ib):
    take_a = (a < b) | ((a == b) & (ia < ib)) | ((a != a) & ((b == b) | (ia < ib)))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


@triton.jit
def _welford_combine(mean_a, m2_a, w_a, mean_b, m2_b, w_b):
    # Chan et al.'s pairwise update of (mean, sum of squared deviations, count)
    w = w_a + w_b
    ratio = tl.where(w == 0.0, 0.0, w_b / tl.where(w == 0.0, 1.0, w))
    delta = mean_b - mean_a
    return mean_a + delta * ratio, m2_a + m2_b + delta * delta * w_a * ratio, w
'''

def needs_int64(problem: LoopProblem) -> bool:
    """64-bit index math when a buffer may span 2**31 elements (always for dynamic sizes)."""
    return needs_wide_index(problem, INT32_MAX)


class _Body(RowOpsHooks, LoopSchedule):
    """The loop schedule in Triton: blocks of ``XBLOCK`` rows by ``RBLOCK`` row elements,
    masked by ``xmask``/``rmask``; reductions over the block's axis 1."""

    def __init__(self, kernel: LoopKernel, interpreted: bool, persistent: bool,
                 descriptors: DescriptorPlan | None = None):
        self.interpreted = interpreted
        self.descriptors = descriptors  # loads/stores that move blocks through tensor descriptors
        self.combine_helpers = False
        self.scan_helpers = False
        self.welford: dict[int, tuple[str, str]] = {}
        self.extremes: dict[tuple[str, int], tuple[str, str]] = {}  # a row's (cummax, its index)
        self.index_checks = checks_enabled()
        self.reported = False  # the body checks something: the kernel takes ``tw_err`` / asserts
        self._ranges: dict = {}
        self._ok: dict[Node, str] = {}  # a checked index -> the block saying where it held
        super().__init__(kernel, persistent)
        self.extents = var_ranges(self.k)

    def make_emitter(self) -> TritonExpr:
        # integer division by zero: an error on the CPU (eager's), none on a GPU (eager's CUDA
        # kernels divide by zero without a trap or an error: the value is undefined there too)
        e = TritonExpr(interpreted=self.interpreted, load=self._load, index=self._index,
                       reduce=self.reduce_inline, scan=self.scan_value,
                       check=self._check_division if self.interpreted else None)
        e.checked = self._checked
        return e

    # -- checks -----------------------------------------------------------------------------------
    def report(self, bad: str, status: int, message: str) -> None:
        """Fail the launch where ``bad`` (a block of lanes) holds. On a GPU a device assert (the
        kernel is launched with ``debug=True``, eager's CUDA kernels assert too). Under the
        interpreter ``tl.device_assert`` does nothing unless the kernel is built with debug and
        even then only checks the condition's truth as a whole, so the check is explicit there:
        the lanes store ``status`` into ``tw_err``, a one-element buffer the launcher reads after
        the launch and raises eager's error for (:func:`tilewright.runtime.status.raise_status`)."""
        self.reported = True
        if self.interpreted:
            name = self.e.fresh()
            self.e.line(f"{name} = {bad}")
            self.e.line(f"tl.store(tw_err + {name}.to(tl.int32) * 0, {status}, mask={name})")
        else:
            self.e.line(f"tl.device_assert(~({bad}), '{message}')")

    def _check_division(self, n: Node) -> None:
        if n.op not in INT_DIVISIONS or not dtypes.is_int(n.dtype):
            return
        divisor = n.src[1]
        if divisor.op == "const" and divisor.arg != 0:
            return
        has_x, has_r = self.node_deps(n)
        lanes = self._mask(has_x, has_r)
        zero = f"({self.e.names[divisor]} == 0)"
        self.report(f"{zero} & {lanes}" if lanes else zero, 1, "integer division by zero")

    def _checked(self, n: Node, value: str, bound: str, mask: str | None) -> str:
        """A gathered index checked against its bound (a view's extent, a one-hot scatter's
        dim) on the lanes that compute it, reported like any gather's; 0 where it fails, and
        the loads through it masked there too (nothing read outside memory)."""
        if not check_needed(n, self.extents, self._ranges):
            return value
        lanes = self._mask(*self.node_deps(n.src[0]))
        if lanes is None:  # one index for every lane (a 0-d index): as a block, or the
            # interpreter's compare of a scalar makes an int32 mask its stores refuse
            value, lanes = f"(({value}) + tl.zeros_like(xindex))", "xmask"
        live = " & ".join(f"({m})" for m in (lanes, mask) if m)
        ok = self.e.fresh()
        self.e.line(f"{ok} = ({value} >= 0) & ({value} < {bound})")
        self.report(f"~{ok} & {live}" if live else f"~{ok}", 2, "index out of bounds")
        safe = self.e.fresh()
        self.e.line(f"{safe} = tl.where({ok}, {value}, 0)")
        self._ok[n] = ok
        return safe

    def _index_guard(self, n: Node, idx, mask: str | None) -> str | None:
        """For a gather (a load whose index reads data): the condition that every data-dependent
        dim index is inside its dim, reported where the load's own lanes break it; None when
        there is nothing to check (no gathered dim, all proven in range, checks off)."""
        indirect = load_indirect(n)
        if not indirect or not self.index_checks:
            return None
        names = self.load_names(n)
        buf = self.k.buffer(n.arg[0])
        conds = []
        for d in unchecked_dims(self.k, n, idx, self.extents, self._ranges):
            at, top = code(idx[d], names), code(buf.shape[d], self.names)
            conds.append(f"(({at}) >= 0) & (({at}) < {top})")
        if not conds:
            return None
        ok = self.e.fresh()
        self.e.line(f"{ok} = {' & '.join(conds)}")
        self.report(f"~{ok} & {mask}" if mask else f"~{ok}", 2, "index out of bounds")
        return ok

    # -- values -----------------------------------------------------------------------------------
    def _mask(self, has_x: bool, has_r: bool) -> str | None:
        parts = (["xmask"] if has_x else []) + (["rmask"] if has_r else [])
        return " & ".join(parts) or None

    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        if self.descriptors is not None and id(n) in self.descriptors.loads:
            value = self.descriptors.load_code(self.descriptors.loads[id(n)], self.persistent)
            return self.e.load_value(value, n.dtype)
        strides = [f"{name}_s{d}" for d in range(len(buf.shape))]
        indirect = load_indirect(n)
        off_expr = offset(idx, [sympy.Symbol(s) for s in strides])
        off = code(off_expr, self.load_names(n))
        has_x, has_r = self.deps(idx)
        for v in indirect:
            has_x = has_x or self.node_deps(v)[0]
            has_r = has_r or self.node_deps(v)[1]
        mask = self._mask(has_x, has_r)
        own = load_mask(n)
        ok = self._index_guard(n, idx, f"({mask} & {self.e.names[own]})" if own is not None and mask else
                               self.e.names[own] if own is not None else mask)
        for v in indirect:  # a checked index: nothing read where it failed (its view may be empty)
            if v in self._ok:
                ok = self._ok[v] if ok is None else f"{ok} & {self._ok[v]}"
        if ok is not None:  # nothing read outside the buffer, checked or not
            mask = f"{mask} & {ok}" if mask else ok
        if own is not None:  # a masked load (cat, pad): only where the mask holds
            own_code = self.e.names[own]
            mask = f"{mask} & {own_code}" if mask else own_code
            # the mask is a block (an index compare is one even when constant): so must the
            # pointer be, where the index alone does not vary (a 0-d gradient read per element)
            mask_r = self.node_deps(own)[1]
            if not has_x:
                off = f"({off}) + xindex * 0"
            if self.reduction and mask_r and not has_r:
                off = f"({off}) + rindex * 0"
        if mask and not sympy.sympify(off_expr).free_symbols and "xindex * 0" not in off:
            # one address for every lane (a 0-d table expanded): the mask is a block, so the
            # pointer must be one too
            off = f"({off}) + xindex * 0" + (" + rindex * 0" if self.reduction and "rmask" in mask else "")
        args = f"{name} + ({off})" + (f", {mask}, other=0" if mask else "")
        value = f"tl.load({args})"
        return self.e.load_value(value, n.dtype)

    def _index(self, n: Node) -> str:
        text = code(n.arg, self.names)
        has_x, has_r = self.deps([n.arg])
        if not has_x and not has_r:
            text = f"({text}) + tl.zeros_like(xindex)"
        return f"({text}).to({TL_DTYPE[dtypes.compute_type(n.dtype)]})"

    def reduce_inline(self, n: Node, v: str) -> str:
        """Persistent rows: the whole reduction at once."""
        kind = n.arg
        cdt = dtypes.compute_type(n.src[0].dtype)
        if kind.startswith("welford"):
            mean, m2 = self._welford_persistent(n.src[0], v)
            return mean if kind == "welford_mean" else m2
        if kind in ("argmax", "argmin"):
            self.combine_helpers = True
            fill = "float('-inf')" if kind == "argmax" else "float('inf')"
            if not dtypes.is_float(cdt):
                fill = _IDENTITY["max" if kind == "argmax" else "min"](cdt)
            vals = f"tl.where(xmask & rmask, {v}, {fill})"
            idx = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])"
            return (f"tl.reduce(({vals}, {idx}), 1, _{kind}_combine)[1][:, None]")
        vals = f"tl.where(xmask & rmask, {v}, {_IDENTITY[kind](cdt)})"
        if kind == "sum":
            return f"tl.sum({vals}, 1)[:, None]"
        self.combine_helpers = True
        fn = {"max": "_max_combine", "min": "_min_combine", "prod": "_prod_combine",
              "any": "_or_combine", "all": "_and_combine"}[kind]
        return f"tl.reduce({vals}, 1, {fn})[:, None]"

    def _welford_persistent(self, src: Node, v: str) -> tuple[str, str]:
        if id(src) not in self.welford:
            mean, m2 = self.e.fresh(), self.e.fresh()
            self.e.line(f"{mean} = tl.sum(tl.where(xmask & rmask, {v}, 0.0), 1)[:, None] / rnumel")
            self.e.line(f"{m2} = tl.sum(tl.where(xmask & rmask, ({v} - {mean}) * ({v} - {mean}), 0.0), 1)[:, None]")
            self.welford[id(src)] = (mean, m2)
        return self.welford[id(src)]

    def write_store(self, s, buf, node: Node, value: str, guard: str | None) -> None:
        if node.op == "const":  # a literal has no .to(): a 0-d tensor (the store broadcasts it)
            value = f"tl.full([], {value}, {TL_DTYPE[dtypes.compute_type(node.dtype)]})"
        if s.is_scatter:
            self.write_scatter(s, buf, node, value)
            return
        if self.descriptors is not None and id(s) in self.descriptors.stores:
            self.e.line(self.descriptors.store_line(self.descriptors.stores[id(s)],
                                                    self.e.store_value(value, node.dtype, buf.dtype),
                                                    self.persistent))
            return
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        off = code(offset(s.index, strides), self.names)
        has_x, has_r = self.deps(s.index)
        r_store = self.on_r(s)
        if not has_x:
            off = f"({off}) + xindex * 0"
        if r_store and not has_r:
            off = f"({off}) + rindex * 0"
        mask = "xmask & rmask" if r_store else "xmask"
        if s.mask is not None:  # a combo kernel's part: only its own share of the space
            mask = f"{mask} & ({self.e.emit(s.mask)})"
        self.e.line(f"tl.store({buf.name} + ({off}), {self.e.store_value(value, node.dtype, buf.dtype)}, {mask})")

    def start_persistent_row(self) -> None:
        self.e.line("rindex = rbase")
        self.e.line("rmask = rindex < rnumel")

    def open_row_loop(self) -> tuple[str, str]:
        self.e.line("for roffset in range(0, rnumel, RBLOCK):")
        self.e.indent += "    "
        self.e.push()
        self.e.line("rindex = roffset + rbase")
        self.e.line("rmask = rindex < rnumel")
        return "rindex", ""

    def close_row_loop(self) -> None:
        self.e.pop()
        self.e.indent = self.e.indent[:-4]

    # -- looped reductions: [XBLOCK, RBLOCK] accumulators, combined along axis 1 ------------------
    def init_accumulators(self, r: Node) -> list[str]:
        self.combine_helpers = True
        kind, cdt = r.arg, dtypes.compute_type(r.src[0].dtype)
        if kind.startswith("welford"):
            accs = [self.e.fresh() for _ in range(3)]  # mean, M2, count
            for a in accs:
                self.e.line(f"{a} = tl.zeros([XBLOCK, RBLOCK], tl.float32)")
            return accs
        if kind in ("argmax", "argmin"):
            accs = [self.e.fresh(), self.e.fresh()]
            fill = (_IDENTITY["max" if kind == "argmax" else "min"](cdt)
                    if not dtypes.is_float(cdt) else "float('-inf')" if kind == "argmax" else "float('inf')")
            self.e.line(f"{accs[0]} = tl.full([XBLOCK, RBLOCK], {fill}, {TL_DTYPE[cdt]})")
            self.e.line(f"{accs[1]} = tl.zeros([XBLOCK, RBLOCK], tl.int64)")
            return accs
        acc = self.e.fresh()
        self.e.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {_IDENTITY[kind](cdt)}, {TL_DTYPE[cdt]})")
        return [acc]

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        kind = r.arg
        if kind.startswith("welford"):
            mean, m2, w = accs
            self.e.line(f"{w}_new = tl.where(xmask & rmask, {w} + 1.0, {w})")
            self.e.line(f"delta = {v} - {mean}")
            self.e.line(f"{mean} = tl.where(xmask & rmask, {mean} + delta / tl.where({w}_new == 0.0, 1.0, {w}_new), {mean})")
            self.e.line(f"{m2} = tl.where(xmask & rmask, {m2} + delta * ({v} - {mean}), {m2})")
            self.e.line(f"{w} = {w}_new")
        elif kind in ("argmax", "argmin"):
            val, idx = accs
            self.e.line(f"{val}, {idx} = _{kind}_combine({val}, {idx}, tl.where(xmask & rmask, {v}, {val}), "
                        f"tl.where(xmask & rmask, rindex.to(tl.int64), {idx}))")
        else:
            a = accs[0]
            fn = {"sum": "{a} + {v}", "prod": "{a} * {v}", "max": "_max_combine({a}, {v})",
                  "min": "_min_combine({a}, {v})", "any": "{a} | {v}", "all": "{a} & {v}"}[kind]
            self.e.line(f"{a} = tl.where(xmask & rmask, {fn.format(a=a, v=v)}, {a})")

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        kind = r.arg
        out = self.e.fresh()
        if kind.startswith("welford"):
            mean, m2, w = accs
            names = self.welford.get(id(r.src[0]))
            if names is None:
                fm, fm2 = self.e.fresh(), self.e.fresh()
                self.e.line(f"{fm}, {fm2}, _ = tl.reduce(({mean}, {m2}, {w}), 1, _welford_combine)")
                names = self.welford[id(r.src[0])] = (f"{fm}[:, None]", f"{fm2}[:, None]")
            return names[0] if kind == "welford_mean" else names[1]
        if kind in ("argmax", "argmin"):
            self.e.line(f"{out} = tl.reduce(({accs[0]}, {accs[1]}), 1, _{kind}_combine)[1][:, None]")
        elif kind == "sum":
            self.e.line(f"{out} = tl.sum({accs[0]}, 1)[:, None]")
        else:
            fn = {"max": "_max_combine", "min": "_min_combine", "prod": "_prod_combine",
                  "any": "_or_combine", "all": "_and_combine"}[kind]
            self.e.line(f"{out} = tl.reduce({accs[0]}, 1, {fn})[:, None]")
        return out


class _TritonLoops(TemplateSpec):
    backend = "triton"
    jinja = "loops.py.jinja"
    # the body comes from the emitter: a change there must retire the tuning records

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        for b in problem.kernel.inputs + problem.kernel.outputs:
            if b.dtype in ("fp8e4m3", "fp8e5m2") and target.backend == "cpu":
                return Support(False, "fp8 buffers in the interpreter")
        for st in problem.kernel.scatters():
            if (why := atomic_refusal(st.accumulate, problem.kernel.buffer(st.buffer).dtype, target)) is not None:
                return Support(False, why)
        return SUPPORTED

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if params.get("DESC") and (why := self.check_descriptors(params, problem, target)) is not None:
            return why
        if (why := pdl_refusal(params, target)) is not None:
            return why
        return self.check_tile(params, problem, target)

    def check_tile(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        return None

    @staticmethod
    def block_r(problem: LoopProblem, params: Params) -> int:
        """The RBLOCK the kernel runs with (1 for pointwise): a persistent row rounded up to a
        power of two, at least ``MIN_DESC_RBLOCK`` on the descriptor path."""
        if problem.kind != "reduction":
            return 1
        if not params.get("PERSISTENT"):
            return params["RBLOCK"]
        rblock = max(1, 1 << max(problem.rnumel - 1, 0).bit_length())
        return max(rblock, MIN_DESC_RBLOCK) if params.get("DESC") else rblock

    def check_descriptors(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        """Why the descriptor path (``DESC``) is illegal here, or None."""
        if not (target.has("tdm") or target.interpreted):
            return (f"{target.name} has no Tensor Data Mover: loop kernels keep pointer loads there "
                    "(descriptors are for TDM targets and the interpreter)")
        if needs_int64(problem):
            return "descriptor block offsets are 32-bit and this kernel needs 64-bit indexing"
        plan = plan_descriptors(problem.kernel, problem.size_map)
        if not plan:
            return "no load or store walks a dense block with 16-byte aligned rows"
        lds = plan.lds_bytes(params["XBLOCK"], self.block_r(problem, params))
        if not target.interpreted and lds > target.smem_per_block:
            return f"descriptor blocks need {lds} bytes of LDS, over the {target.smem_per_block} a block may use"
        return None

    def _render_body(self, problem: LoopProblem, params: Params, target: Target,
                     descriptors: DescriptorPlan | None = None) -> tuple[_Body, bool]:
        persistent = bool(params.get("PERSISTENT", False))
        return _Body(problem.kernel, target.interpreted, persistent, descriptors).build(), persistent

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        k = problem.kernel
        body, persistent = self._render_body(problem, params, target)
        names = {s: s.name for s in k.size_symbols()}
        desc_body, desc_condition = None, ""
        if params.get("DESC"):  # both bodies: the launcher takes the pointer one when a layout disagrees
            plan = plan_descriptors(k, problem.size_map)
            desc, _ = self._render_body(problem, params, target, plan)
            desc_body = desc
            desc_condition = plan.launch_condition(k)
            desc_lines = plan.setup_lines(names) + desc.e.lines
        sizes = [s.name for s in k.size_symbols()]
        buffers = list(k.inputs) + list(k.outputs)
        strides = [f"{b.name}_s{d}" for b in buffers for d in range(len(b.shape))]
        kernel_name = f"tw_{problem.kind}"
        combine = body.combine_helpers
        if desc_body is not None:  # both bodies call the same helpers
            body.e.helpers_used |= desc_body.e.helpers_used
            combine = combine or desc_body.combine_helpers
        scans = body.scan_helpers or (desc_body is not None and desc_body.scan_helpers)
        if scans and target.interpreted:
            body.e.helpers_used.add("_log1p")  # the logaddexp combine's log1p
        checked = body.reported or (desc_body is not None and desc_body.reported)
        helpers = body.e.helpers() + (_COMBINE_HELPERS if combine else "") + (
            SCAN_HELPERS.replace("LOG1P", "_log1p" if target.interpreted else "libdevice.log1p") if scans else "")
        source = self.render_jinja(
            problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name,
            kernel_name=kernel_name, reduction=problem.kind == "reduction", persistent=persistent,
            interpreted=target.interpreted, index_64=needs_int64(problem),
            err_flag=checked and target.interpreted, asserts=checked and not target.interpreted,
            helpers=helpers,
            inputs=[b.name for b in k.inputs], outputs=[{
                "name": b.name, "dtype": str(dtypes.TORCH[b.dtype]), "init": b.init,
                "shape": [code(s, names) for s in b.shape], "stride": [code(s, names) for s in b.stride],
            } for b in k.outputs],
            buffers=[b.name for b in buffers], strides=strides, sizes=sizes,
            xnumel=code(k.xnumel, names), rnumel=code(k.rnumel, names),
            body=signal_before_stores(body.e.lines) if params.get("PDL") else body.e.lines,
            pdl=bool(params.get("PDL")), gdc_import=GDC_IMPORT,
            XBLOCK=params["XBLOCK"], RBLOCK=params.get("RBLOCK", 1),
            num_warps=params["num_warps"],
            desc_body=desc_lines if desc_body is not None else None, desc_condition=desc_condition,
            rblock_floor=MIN_DESC_RBLOCK if desc_body is not None else 1,
        )
        aot = None if target.interpreted else self.aot_spec(problem, params, kernel_name, strides, sizes, checked)
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name, source=source,
                              name=f"triton_{problem.kind}", interpret=target.interpreted, aot=aot,
                              meta={"kind": problem.kind, "descriptors": desc_body is not None})

    def expected_instructions(self, problem: LoopProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        """What the compiled kernel must contain (measured with triton 3.9, sm_90a, sm_100a,
        gfx950, gfx1250):

        * always: code for the target's own ISA (``.target sm_90a``, ``.amdgcn_target ...gfx1250``);
        * ``DESC`` (gfx1250): ``tensor_load_to_lds`` when a load goes through a descriptor,
          ``tensor_store_from_lds`` when a store does, and ``s_wait_tensorcnt``;
        * otherwise, vector global loads (stores) when a dense load (store) gives each thread at
          least 8 contiguous bytes and the strides and element counts carry the divisibility
          facts the AOT spec passes (``ld.global.v2``/``v4``, ``global_load_dwordx2``..,
          ``global_load_b64``/``b128``); gathers, transposed and masked accesses promise nothing.
        """
        params = self.space.complete(params)
        if target.interpreted:
            return []
        if target.backend == "cuda":
            # triton writes the arch-specific variant: sm_120 compiles to ``.target sm_120a``
            checks = [InstructionCheck("ptx", (rf"(?m)^\.target {target.arch}a?\b",), (),
                                       f"code for {target.arch}")] + pdl_checks(params, target)
            vec_load, vec_store = r"ld\.global(\.\w+)*\.v[248]\.", r"st\.global(\.\w+)*\.v[248]\."
        elif target.backend == "hip":
            checks = [InstructionCheck("amdgcn", (rf'\.amdgcn_target "[^"]*{target.arch}"',), (),
                                       f"code for {target.arch}")]
            width = "dwordx[234]" if target.arch.startswith("gfx9") else "b(64|96|128)"
            vec_load, vec_store = rf"(global|buffer)_load_{width}", rf"(global|buffer)_store_{width}"
        else:
            return []
        plan = plan_descriptors(problem.kernel, problem.size_map)
        if params.get("DESC"):
            need = (["tensor_load_to_lds"] if plan.loads else []) + \
                   (["tensor_store_from_lds"] if plan.stores else []) + ["s_wait_tensorcnt"]
            checks.append(InstructionCheck("amdgcn", tuple(need), (), "TDM block loads/stores (tensor descriptors)"))
            return checks
        artifact = checks[0].artifact
        loads = [d for d in dict.fromkeys(plan.loads.values()) if self._vectorises(d, problem, params, target)]
        stores = [d for d in dict.fromkeys(plan.stores.values()) if self._vectorises(d, problem, params, target)]
        if loads:
            checks.append(InstructionCheck(artifact, (vec_load,), (),
                                           f"vector loads of {', '.join(sorted({d.buffer for d in loads}))}"))
        if stores:
            checks.append(InstructionCheck(artifact, (vec_store,), (),
                                           f"vector stores of {', '.join(sorted({d.buffer for d in stores}))}"))
        return checks

    def _vectorises(self, d, problem: LoopProblem, params: Params, target: Target) -> bool:
        """Whether Triton's pointer access of a dense block ``d`` becomes >= 8-byte vectors:
        every stride of the buffer 1 or a multiple of 16, the counts masking it multiples of
        16, and >= 8 contiguous bytes per thread (Triton's coalescing: at most 16 bytes, at
        most the block's elements over the threads, at most one row of a reduction)."""
        b = problem.kernel.buffer(d.buffer)
        for n, st in zip(b.shape, b.stride):
            if n != 1 and (st.free_symbols or int(st) != 1 and int(st) % 16):
                return False
        count = problem.kernel.xnumel if d.pattern == "x" else problem.kernel.rnumel  # the contiguous mask
        if count.free_symbols or int(count) % 16:
            return False
        threads = params["num_warps"] * target.warp_size
        xblock, rblock = params["XBLOCK"], self.block_r(problem, params)
        elems = {"x": xblock, "xr": xblock * rblock, "r": rblock}[d.pattern]
        per_thread = min(16 // d.itemsize, max(1, elems // threads))
        if d.pattern != "x":
            per_thread = min(per_thread, rblock)
        return per_thread * d.itemsize >= 8

    def aot_spec(self, problem: LoopProblem, params: Params, kernel_name: str, strides: list[str],
                 sizes: list[str], asserts: bool = False) -> AotSpec:
        k = problem.kernel
        pointers = {b.name: POINTER[b.dtype] for b in k.inputs + k.outputs}
        sizes_at = problem.size_map
        constexprs: dict[str, Any] = {"XBLOCK": params["XBLOCK"]}
        if problem.kind == "reduction":
            constexprs["RBLOCK"] = self.block_r(problem, params)
        if params.get("DESC"):
            # the descriptor body; the layout and alignment it assumes are those traced (as the
            # unit strides and divisibility below are)
            constexprs["USE_DESC"] = True
        # the strides the JIT would specialise: unit strides become constants
        for b in k.inputs + k.outputs:
            for d, st in enumerate(b.stride):
                if not st.free_symbols and int(st) == 1:
                    constexprs[f"{b.name}_s{d}"] = 1
        divisible = list(pointers)
        for b in k.inputs + k.outputs:
            for d, st in enumerate(b.stride):
                v = st.xreplace(sizes_at)
                if f"{b.name}_s{d}" not in constexprs and not st.free_symbols and int(v) % 16 == 0 and int(v) > 0:
                    divisible.append(f"{b.name}_s{d}")
        # and the JIT's divisibility of static element counts: with it the bounds masks are
        # uniform over 16 elements and contiguous accesses vectorise (measured: without it
        # every load and store is scalar on sm_90a, gfx950 and gfx1250)
        for name, numel in (("xnumel", k.xnumel), ("rnumel", k.rnumel)):
            if name == "rnumel" and problem.kind != "reduction":
                continue
            if not numel.free_symbols and int(numel) > 0 and int(numel) % 16 == 0:
                divisible.append(name)
        options: dict[str, Any] = {"num_warps": params["num_warps"], "num_stages": 1}
        if params.get("PDL"):
            options["launch_pdl"] = True
        if asserts:  # the bounds checks' device asserts (Triton drops them without debug)
            options.update(ASSERT_OPTIONS)
        return AotSpec(kernel_name, "triton", pointers, constexprs, tuple(divisible), options,
                       int_type="i64" if needs_int64(problem) else "i32")


class TritonPointwise(_TritonLoops):
    """Pointwise kernels: ``XBLOCK`` elements per program."""

    id = "triton.pointwise"
    op = "pointwise"
    space = ParamSpace((
        Knob("XBLOCK", powers_of_two(16, 65536), 1024, "elements per program"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("DESC", (False, True), False, "dense accesses through tensor descriptors (TDM on gfx1250)"),
        PDL_KNOB,
    ))


class TritonReduction(_TritonLoops):
    """Reduction kernels: ``XBLOCK`` rows per program; whole rows in registers
    (``PERSISTENT``) or ``RBLOCK`` columns at a time."""

    id = "triton.reduction"
    op = "reduction"
    space = ParamSpace((
        Knob("XBLOCK", powers_of_two(1, 4096), 1, "rows per program"),
        Knob("RBLOCK", powers_of_two(16, 8192), 1024, "columns per step of a looped row"),
        Knob("PERSISTENT", (False, True), True, "hold the whole row (RBLOCK = row rounded up to 2^k)"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("DESC", (False, True), False, "dense accesses through tensor descriptors (TDM on gfx1250)"),
        PDL_KNOB,
    ))

    def check_tile(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        if target.interpreted:
            return None
        rblock = self.block_r(problem, params)
        threads = params["num_warps"] * target.warp_size
        per_thread = params["XBLOCK"] * rblock / threads
        if params["PERSISTENT"] and per_thread > 64:
            return (f"a persistent row block of {params['XBLOCK']}x{rblock} holds {per_thread:.0f} "
                    f"values per thread (> 64): loop over the row instead")
        if not params["PERSISTENT"] and params["RBLOCK"] >= 2 * max(problem.rnumel, 1):
            return "RBLOCK is over twice the row: use the persistent form"
        return None

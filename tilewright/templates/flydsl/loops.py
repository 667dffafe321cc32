"""FlyDSL loop kernels for gfx950 (``flydsl.pointwise``, ``flydsl.reduction``): the
:class:`~tilewright.problem.LoopProblem` kinds, rendered through the FlyDSL expression emitter
(:mod:`tilewright.templates.flydsl.emit`) into ``loops.py.jinja``.

Pointwise: a workgroup of ``64 * num_warps`` lanes covers ``XBLOCK`` consecutive elements of the
flattened iteration space, lane ``l`` taking elements ``l, l + LANES, ...`` (coalesced); the
elements past ``xnumel`` are skipped.

Reduction (over the kernel's reduction dims, the contiguous last dim of RMSNorm and softmax
included): one workgroup per row (output point). Lane ``l`` walks the row at ``l, l + LANES,
...`` (any row length: rows longer than the workgroup are looped, ``RBLOCK = LANES`` elements a
pass) keeping one partial per reduction; ``fx.coop.BlockReduce`` (FlyDSL's library: a
register butterfly in each wave, DPP/swizzle on gfx950, then the waves' partials through LDS)
gives every lane the row's value. Dependent reductions (softmax's max, then the sum of
``exp(x - max)``) take one pass per level; values stored per element take one more pass
(RMSNorm: ``x * rsqrt(mean(x*x) + eps) * w`` is one sum pass, then the store pass); values
stored per row are written by lane 0. Sums add in lane order within a pass and in a fixed
butterfly/warp order across lanes: :func:`row_reduce_in_torch` is that order written in torch,
the proof the tests run on this host. max/min propagate NaN (``fx.max``/``fx.min`` are
``arith.maximumf``/``minimumf``).

Loads and stores index the tensors by logical coordinates through FlyDSL's layouts, whose
shapes and strides are run-time values taken from the tensors, so any layout is read and
written correctly. Gathers (embedding: an index that is data) index through the loaded value;
masked loads (cat, pad) read memory only under an ``if`` of their mask (0 elsewhere), masked
stores (combo kernels) store under one. Index arithmetic is 32-bit: problems whose buffers
reach 2**31 elements are refused. Refused too, with reasons: GEMM accumulators,
argmax/argmin/Welford/any/all and non-float reductions, 0-d/fp8/fp64 buffers, math the
compile-only setup cannot link (:func:`tilewright.templates.flydsl.emit.unsupported_op`).

The module's ``launch(*inputs, *sizes, outs=None)`` runs the kernel on a ROCm gfx950 device on
the current stream (:mod:`tilewright.templates.flydsl.launch`); ahead of time it is built through
the same ``launch``, compile-only (:mod:`tilewright.templates.flydsl.runtime`). The numerics of the
compiled kernels are not measured here (no gfx950 has run them); the rendered source runs in
the tests' interpreter and the reduction order is proven in torch form.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from tilewright.ir import dtypes
from tilewright.ir.bounds import checks_enabled, unproven_gathers
from tilewright.ir.expr import Node, load_mask
from tilewright.ir.index import CodePrinter, code, static_or_hint
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.runtime.verify import InstructionCheck
from tilewright.templates.base import SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec
from tilewright.templates.loop_schedule import LoopSchedule, strided_scan_refusal
from tilewright.templates.flydsl.emit import FLY, FlyExpr, check_nodes, literal
from tilewright.templates.flydsl.gemm import LaunchedWhereInstalled

ARCH = "gfx950"
WAVE = 64
INT32_MAX = 2**31 - 1
BUFFER_DTYPES = ("fp32", "bf16", "fp16", "i32", "i64", "bool")
# reduction kind -> (FlyDSL ReductionOp, identity of an empty partial)
REDUCE_OPS = {"sum": ("ADD", 0.0), "prod": ("MUL", 1.0), "max": ("MAX", float("-inf")),
              "min": ("MIN", float("inf"))}
_TORCH_COMBINE = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}
_COMBINE = {"sum": "({a} + {v})", "prod": "({a} * {v})", "max": "fx.max({a}, {v})", "min": "fx.min({a}, {v})"}


class FlyIndexPrinter(CodePrinter):
    """Integer index expressions as FlyDSL Python: ``//`` and ``%`` (floor semantics, exact for
    the non-negative values indices take), Max/Min through ``fx.max``/``fx.min``."""

    def _print_Max(self, expr: sympy.Expr) -> str:
        return f"fx.max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr: sympy.Expr) -> str:
        return f"fx.min({', '.join(self._print(a) for a in expr.args)})"


def fcode(e: Any, names: dict[sympy.Symbol, str]) -> str:
    return FlyIndexPrinter(names).doprint(sympy.sympify(e))


def problem_refusal(problem: LoopProblem) -> str | None:
    """Why the FlyDSL loop templates cannot render ``problem`` (None when they can)."""
    k = problem.kernel
    for b in k.inputs + k.outputs:
        if b.dtype not in BUFFER_DTYPES:
            return f"{b.dtype} buffers ({b.name}) are not written for FlyDSL (takes {', '.join(BUFFER_DTYPES)})"
        if not b.shape:
            return f"0-d buffer {b.name}: FlyDSL layouts here index tensors of rank >= 1"
        numel = static_or_hint(sympy.Mul(*b.shape), problem.size_map)
        if numel > INT32_MAX:
            return f"{b.name} has {numel} elements: the kernels index in 32 bits"
    for n in k.nodes():
        if n.op == "acc":
            return "GEMM accumulators belong to a GEMM template"
        if n.op == "reduce":
            if n.arg not in REDUCE_OPS:
                return f"{n.arg} reductions are not written for FlyDSL (sum, prod, max, min are)"
            if dtypes.compute_type(n.src[0].dtype) != "fp32":
                return f"{n.arg} of {n.src[0].dtype}: FlyDSL reductions here combine fp32 values"
    if checks_enabled() and unproven_gathers(k):
        # no device assert here and no error flag written: a gather whose index is not proven in
        # range would read outside its buffer without a word (eager's GPU kernels assert)
        return ("a gather through indices not proven in range: FlyDSL kernels have no bounds check "
                "written (Triton's assert); config.index_checks=False lets it render")
    return check_nodes(k.nodes())


class _Body(LoopSchedule):
    """The loop schedule in FlyDSL: lane ``tid`` of ``LANES`` walks its elements (pointwise:
    ``XBLOCK`` per workgroup; reductions: its strided share of the row), the workgroup's
    ``_ROW`` (``fx.coop.BlockReduce``) combines a row's partials."""

    def __init__(self, kernel: LoopKernel, lanes: int):
        self.lanes = lanes
        self.storages: list[str] = []
        self._loop = 0
        super().__init__(kernel)

    def make_emitter(self) -> FlyExpr:
        e = FlyExpr(load=self._load, index=self._index, reduce=self.reduce_inline)
        # no check written: supports() refuses a checked index not proven in range
        e.checked = lambda n, value, bound, mask: value
        return e

    # -- values -----------------------------------------------------------------------------------
    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        names = self.load_names(n, "{}.to(fx.Int32)")  # gathered indices: the values computed for them
        coords = [fcode(i, names) for i in idx]
        element = f"{name}[{coords[0]}]" if len(coords) == 1 else f"{name}[({', '.join(coords)})]"
        value = self.e.load_value(element, buf.dtype)
        ct = dtypes.compute_type(n.dtype)
        if dtypes.compute_type(buf.dtype) != ct:
            value = f"{value}.to({FLY[ct]})"
        own = load_mask(n)
        if own is None:
            return value
        # a masked load (cat, pad) reads memory only where the mask holds (its index may be out
        # of bounds elsewhere), else 0: FlyDSL turns the `if` into scf.if carrying the value
        out = self.e.fresh()
        self.e.line(f"{out} = {literal(0, ct)}")
        self.e.line(f"if {self.e.names[own]}:")
        self.e.line(f"    {out} = {value}")
        return out

    def _index(self, n: Node) -> str:
        return f"{FLY[dtypes.compute_type(n.dtype)]}({fcode(n.arg, self.names)})"

    # -- statements -------------------------------------------------------------------------------
    def index_code(self, e: sympy.Expr) -> str:
        return fcode(e, self.names)

    def write_store(self, s, buf, node: Node, value: str, guard: str | None) -> None:
        coords = [fcode(i, self.names) for i in s.index]
        target = f"{buf.name}[{coords[0]}]" if len(coords) == 1 else f"{buf.name}[({', '.join(coords)})]"
        text = f"{target} = {self.e.store_value(value, node.dtype, buf.dtype)}"
        if s.mask is not None:  # a combo kernel's part: only its own share of the space
            self.e.line(f"if {self.e.emit(s.mask)}:")
            text = "    " + text
        self.e.line(text)

    def write_row_stores(self, stores: list) -> None:
        self.e.line("if tid == 0:")
        self._open()
        for s in stores:
            self.store(s, None)
        self._close()

    def _open(self) -> None:
        self.e.indent += "    "
        self.e.push()

    def _close(self) -> None:
        self.e.pop()
        self.e.indent = self.e.indent[:-4]

    def open_row_loop(self) -> tuple[str, str]:
        # each loop's variables are its own, so FlyDSL's loop rewriter never sees them carried
        # across loops
        self._loop += 1
        rindex = f"rindex{self._loop}"
        self.e.line(f"for {rindex} in range(tid, rnumel, LANES):")
        self._open()
        return rindex, f"_{self._loop}"

    def close_row_loop(self) -> None:
        self._close()

    # -- reductions: a partial per lane, then the workgroup combine -------------------------------
    def init_accumulators(self, r: Node) -> list[str]:
        acc = self.e.fresh()
        self.e.line(f"{acc} = {literal(REDUCE_OPS[r.arg][1], 'fp32')}")
        return [acc]

    def update_accumulators(self, r: Node, accs: list[str], v: str) -> None:
        self.e.line(f"{accs[0]} = {_COMBINE[r.arg].format(a=accs[0], v=v)}")

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        storage = f"lds{len(self.storages)}"  # one LDS slot per reduction: no reuse, no extra barrier
        self.storages.append(storage)
        out = self.e.fresh()
        self.e.line(f"{out} = _ROW({accs[0]}, fx.ReductionOp.{REDUCE_OPS[r.arg][0]}, storage={storage})")
        return out


def _wave64_in_torch(acc: torch.Tensor, combine, ident: float) -> torch.Tensor:
    """FlyDSL's gfx9 wave reduction (``coop.warp_reduce`` for built-in ops on a full wave64) on
    ``acc`` (..., 64): DPP ``row_shr`` 1, 2, 4, 8 inside each 16-lane row (lanes with no source
    read the identity), ``row_bcast15`` into rows 1 and 3, ``row_bcast31`` into rows 2 and 3,
    then lane 63's value, which every lane receives (``readlane``)."""
    lane = torch.arange(WAVE)
    for s in (1, 2, 4, 8):
        moved = torch.where((lane % 16) >= s, acc[..., (lane - s).clamp_min(0)], ident)
        acc = combine(acc, moved)
    row = lane // 16
    acc = combine(acc, torch.where((row == 1) | (row == 3), acc[..., (row * 16 - 1).clamp_min(0)], ident))
    acc = combine(acc, torch.where(row >= 2, acc[..., 31:32].expand_as(acc), ident))
    return acc[..., 63]


def block_reduce_in_torch(partials: torch.Tensor, kind: str) -> torch.Tensor:
    """``BlockReduce`` WARP_REDUCTIONS on the lanes' partials (..., lanes), fp32 -> (...,): each
    wave as :func:`_wave64_in_torch`, then the waves' totals folded in wave order (through LDS).

    Raises:
        ValueError: a lane count that is not a multiple of 64, or ``kind`` not in :data:`REDUCE_OPS`.
    """
    lanes = partials.shape[-1]
    if lanes % WAVE or kind not in REDUCE_OPS:
        raise ValueError(f"lanes={lanes} (a multiple of {WAVE}), kind={kind!r} (one of {list(REDUCE_OPS)})")
    combine = _TORCH_COMBINE[kind]
    waves = _wave64_in_torch(partials.reshape(*partials.shape[:-1], lanes // WAVE, WAVE), combine,
                             REDUCE_OPS[kind][1])
    total = waves[..., 0]
    for w in range(1, lanes // WAVE):
        total = combine(total, waves[..., w])
    return total


def row_reduce_in_torch(values: torch.Tensor, lanes: int, kind: str = "sum") -> torch.Tensor:
    """The reduction kernel's combine order, written in torch: ``values`` (rows, n), fp32 ->
    (rows,) fp32, combined in the order the rendered kernel combines them.

    Lane ``l`` folds elements ``l, l + lanes, ...`` left to right from the identity (the row
    loop: lanes past the row end never enter it and keep the identity), then
    :func:`block_reduce_in_torch` combines the lanes.

    Raises:
        ValueError: ``lanes`` not a multiple of 64, or ``kind`` not in :data:`REDUCE_OPS`.
    """
    if lanes % WAVE or kind not in REDUCE_OPS:
        raise ValueError(f"lanes={lanes} (a multiple of {WAVE}), kind={kind!r} (one of {list(REDUCE_OPS)})")
    rows, n = values.shape
    ident = REDUCE_OPS[kind][1]
    combine = _TORCH_COMBINE[kind]
    passes = -(-n // lanes)
    padded = torch.full((rows, passes * lanes), ident, dtype=torch.float32)
    padded[:, :n] = values.float()
    acc = torch.full((rows, lanes), ident, dtype=torch.float32)
    for p in range(passes):
        acc = combine(acc, padded[:, p * lanes:(p + 1) * lanes])
    return block_reduce_in_torch(acc, kind)


class _FlyLoops(LaunchedWhereInstalled, TemplateSpec):

    backend = "flydsl"
    jinja = "loops.py.jinja"

    def problem_support(self, problem: Any, target: Target) -> Support:
        """Whether this template renders ``problem`` for ``target`` (the toolchain is the language's check)."""
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if target.arch != ARCH:
            return Support(False, f"{self.id} is written for {ARCH} (wave64), not {target.name}")
        why = problem_refusal(problem) or strided_scan_refusal(problem.kernel)
        return Support(False, why) if why else SUPPORTED

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        why = self.space_refusal(params)
        if why:
            return why
        p = self.space.complete(params)
        lanes = p["num_warps"] * WAVE
        if lanes > min(target.max_threads_per_block, 1024):
            return f"{lanes} lanes per workgroup exceed {min(target.max_threads_per_block, 1024)}"
        return self._check(p, lanes)

    def _check(self, p: dict, lanes: int) -> str | None:
        return None

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        p = params
        k = problem.kernel
        lanes = p["num_warps"] * WAVE
        body = _Body(k, lanes).build()  # rows are always looped (one workgroup per row)
        reduction = problem.kind == "reduction"
        sizes = problem.size_map
        hint = lambda e: static_or_hint(sympy.sympify(e), sizes)  # noqa: E731
        buffers = list(k.inputs) + list(k.outputs)
        names = {sym: sym.name for sym in k.size_symbols()}
        kernel_name = f"tw_fly_{problem.kind}"
        source = self.render_jinja(
            problem_text=problem.describe().replace("\n", "\n# "), params_text=self.space.encode(p),
            target=target.name, arch=ARCH, kernel_name=kernel_name, reduction=reduction,
            helpers=body.e.helpers(), buffers=[b.name for b in buffers],
            sizes=[s.name for s in k.size_symbols()], size_values=[hint(s) for s in k.size_symbols()],
            inputs=[b.name for b in k.inputs], xnumel_code=code(k.xnumel, names), rnumel_code=code(k.rnumel, names),
            outputs=[{"dtype": str(dtypes.TORCH[b.dtype]), "shape": [code(s, names) for s in b.shape],
                      "stride": [code(s, names) for s in b.stride]} for b in k.outputs],
            storages=body.storages, body=body.e.lines, LANES=lanes, num_warps=p["num_warps"],
            XBLOCK=p["XBLOCK"], xnumel=hint(k.xnumel), rnumel=hint(k.rnumel),
            placeholders=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]),
                           "shape": tuple(hint(s) for s in b.shape),
                           "stride": tuple(hint(s) for s in b.stride)} for b in buffers])
        return RenderedKernel(
            template_id=self.id, params=p, target=target.name, source=source,
            name=f"flydsl_{problem.kind}", entry="launch", language="flydsl",
            meta={"kind": problem.kind, "language": "flydsl", "lanes": lanes,
                  "lds_bytes": self.lds_bytes(problem, p)},
            aot=AotSpec(kernel="launch", language="flydsl", pointer_types={}, constexprs={},
                        divisible_by_16=(), options={"gpu_arch": target.arch}))

    def lds_bytes(self, problem: LoopProblem, p: dict) -> int:
        """LDS the kernel allocates, bytes: one fp32 slot per wave for each reduction (the
        waves' partials; a single wave needs none). Far under gfx950's 160 KiB."""
        if problem.kind != "reduction" or p["num_warps"] == 1:
            return 0
        return len(problem.kernel.reductions()) * p["num_warps"] * 4

    def expected_instructions(self, problem: LoopProblem, params: Params, target: Target) -> list[InstructionCheck]:
        p = self.space.complete(params)
        checks = [InstructionCheck("amdgcn", (rf'\.amdgcn_target "[^"]*{target.arch}"',
                                              r"\b(global|buffer)_load_", r"\b(global|buffer)_store_"),
                                   (r"\bscratch_(load|store)", r"__ocml_"),
                                   f"{target.arch} code that loads and stores, no spills, no device library")]
        if problem.kind == "reduction":
            checks.append(InstructionCheck(
                "amdgcn", (r"\b(v_\w+_dpp|ds_swizzle_b32|ds_bpermute_b32|v_permlane\w+)\b",),
                (), "the row combine across a wave in registers (DPP / swizzle / permute)"))
            if p["num_warps"] > 1:
                checks.append(InstructionCheck(
                    "amdgcn", (r"\bs_barrier\b", r"\bds_write", r"\bds_read",
                               rf"\.amdhsa_group_segment_fixed_size {self.lds_bytes(problem, p)}\b"),
                    (), "the waves' partials through LDS, as much LDS as planned"))
        return checks


class FlyPointwise(_FlyLoops):
    """Pointwise kernels: ``XBLOCK`` elements per workgroup of ``num_warps`` waves."""

    id = "flydsl.pointwise"
    op = "pointwise"
    space = ParamSpace((Knob("XBLOCK", (64, 128, 256, 512, 1024, 2048, 4096), 1024, "elements per workgroup"),
                        Knob("num_warps", (1, 2, 4, 8), 4, "wave64 wavefronts per workgroup")))

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict]:
        return [{"XBLOCK": 1024, "num_warps": 4}, {"XBLOCK": 256, "num_warps": 4},
                {"XBLOCK": 2048, "num_warps": 8}]

    def _check(self, p: dict, lanes: int) -> str | None:
        if p["XBLOCK"] % lanes or p["XBLOCK"] // lanes > 16:
            return f"XBLOCK={p['XBLOCK']} must be 1 to 16 elements per lane of {lanes}"
        return None


class FlyReduction(_FlyLoops):
    """Row reductions: one workgroup of ``num_warps`` waves per row, ``RBLOCK = 64 * num_warps``
    elements of the row per pass (looped rows)."""

    id = "flydsl.reduction"
    op = "reduction"
    space = ParamSpace((Knob("XBLOCK", (1,), 1, "rows per workgroup"),
                        Knob("RBLOCK", (64, 128, 256, 512, 1024), 256, "row elements per pass (= lanes)"),
                        Knob("PERSISTENT", (False,), False, "rows are looped, never held whole"),
                        Knob("num_warps", (1, 2, 4, 8, 16), 4, "wave64 wavefronts per workgroup")))

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict]:
        # enough lanes to cover the row in few passes, never more than the row has elements
        out = []
        for w in (1, 2, 4, 8, 16):
            if w == 1 or WAVE * w <= max(problem.rnumel, WAVE):
                out.append({"XBLOCK": 1, "RBLOCK": WAVE * w, "PERSISTENT": False, "num_warps": w})
        return out

    def _check(self, p: dict, lanes: int) -> str | None:
        if p["RBLOCK"] != lanes:
            return f"RBLOCK={p['RBLOCK']} must equal the lanes (64 * num_warps = {lanes})"
        return None

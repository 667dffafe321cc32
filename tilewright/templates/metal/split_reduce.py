"""``metal.split_reduction``: reductions whose rows are few and long (a decode step's softmax
over a 128,256-token vocabulary: one row), each row split across ``SPLIT`` threadgroups.

``metal.reduction`` puts one row in one threadgroup, so a single row runs on at most 1024
threads of one GPU core. Here threadgroup ``(row, chunk)`` owns a contiguous chunk of
``ceil(rnumel / SPLIT)`` elements of its row, and the kernel's reductions are computed in
passes, one kernel function (one launch) each, in the order of their dependence levels:

- a partial pass walks its chunk as the looped schedule walks a row (``metal/loops.py``'s
  body, the chunk in place of the row), combines across the threadgroup
  (:mod:`tilewright.templates.metal.reduce`) and thread 0 writes the chunk's partial
  components (a sum; a max; argmax's value and position; Welford's mean, M2 and count) to a
  scratch buffer, ``part[row * SPLIT + chunk]``;
- every later pass first folds the ``SPLIT`` partials of each finished reduction, in chunk
  order, with the reduction's own combine (NaN-propagating max/min, lowest position on ties,
  Chan's update for Welford), so each thread holds the row's values, then does its own work;
- the last pass writes the per-element outputs over its chunk and the per-row outputs
  (chunk 0, thread 0).

Softmax and log-softmax (a sum of ``exp(x - max(x))``, recognised in the IR) take the online
form: the first pass computes the chunk's max ``m_c`` and then, over the same chunk (in cache),
``s_c = sum(exp(x - m_c))``; the combine is ``M = max(m_c)``, ``S = sum(s_c * exp(m_c - M))``.
So softmax is two launches, not three. A chunk that is all ``-inf`` (masked logits) has
``m_c = -inf``; its sum is taken with the shift 0 (so it is 0, not ``exp(-inf + inf)``), and the
combine uses the same shift; a row that is all ``-inf`` gives NaN, as ``torch.softmax`` does.

Offered where rows are few and long (fewer rows than GPU cores, at least 4096 elements): the
policy's cost model (:func:`tilewright.kinds.loop.cost.estimate_loop`, which counts the
``SPLIT`` threadgroups and the extra launches) weighs it against ``metal.reduction``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tilewright.ir import dtypes
from tilewright.ir.expr import Node, toposort
from tilewright.ir.index import code
from tilewright.ir.kernel import LoopKernel
from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import Knob, ParamSpace, Params, RenderedKernel, Support
from tilewright.templates.metal.emit import MSL_TYPE
from tilewright.templates.metal.limits import threadgroup_refusal
from tilewright.templates.metal.loops import MAX_BUFFERS, MAX_THREADS_PER_GROUP, _Body, _MetalLoops, needs_int64
from tilewright.templates.metal.reduce import SIMD_WIDTH, Reduction

MIN_ROW = 4096      # shorter rows fit one threadgroup's few passes: metal.reduction's
MIN_CHUNK = 256     # elements per threadgroup at least (a chunk under a threadgroup idles threads)


def online_pairs(kernel: LoopKernel) -> dict[Node, Node]:
    """``{sum node: max node}`` for every ``sum(exp(x - max(x)))`` of the kernel (softmax's and
    log-softmax's denominator) over fp32 values: the pairs the online form computes in one pass."""
    out = {}
    for r in kernel.reductions():
        if r.arg != "sum" or r.src[0].op != "exp" or r.src[0].src[0].op != "sub":
            continue
        a, m = r.src[0].src[0].src
        if m.op == "reduce" and m.arg == "max" and m.src[0] is a and m.dtype == "fp32":
            out[r] = m
    return out


@dataclass
class Entry:
    """One reduction's partials: the node(s) it yields (two for Welford's mean and M2), its
    :class:`Reduction`, the scratch buffer of each component, and for an online sum its max."""

    nodes: list[Node]
    red: Reduction
    parts: list[str]
    online_max: Node | None = None


@dataclass
class Schedule:
    """The passes of a split-row kernel: per pass, its plain reductions and its online sums
    (computed after the pass's max), and the scratch entries they write."""

    passes: list[tuple[list[Node], list[Node]]] = field(default_factory=list)
    entries: list[list[Entry]] = field(default_factory=list)
    parts: list[tuple[str, str]] = field(default_factory=list)  # (name, MSL type)

    @property
    def launches(self) -> int:
        return len(self.passes) + 1


def schedule(kernel: LoopKernel) -> Schedule:
    """The passes of ``kernel`` split over threadgroups (see the module docstring)."""
    level: dict[int, int] = {}
    for n in toposort(kernel.values() + [s.mask for s in kernel.stores if s.mask is not None]):
        level[id(n)] = max((level.get(id(s), 0) for s in n.src), default=0) + (1 if n.is_reduce else 0)
    online = online_pairs(kernel)
    reduces = kernel.reductions()
    out = Schedule()
    for lv in sorted({level[id(r)] for r in reduces if r not in online}):
        plain = [r for r in reduces if level[id(r)] == lv and r not in online]
        sums = [s for s, m in online.items() if m in plain]
        out.passes.append((plain, sums))
        entries: list[Entry] = []
        for r in plain + sums:
            kind = "welford" if r.arg.startswith("welford") else r.arg
            if kind == "welford":
                same = next((e for e in entries if e.red.kind == "welford" and e.nodes[0].src[0] is r.src[0]), None)
                if same is not None:
                    same.nodes.append(r)
                    continue
            red = Reduction(kind, dtypes.compute_type(r.src[0].dtype))
            parts = []
            for t in red.msl_types:
                parts.append(f"part{len(out.parts)}")
                out.parts.append((parts[-1], t))
            entries.append(Entry([r], red, parts, online.get(r)))
        out.entries.append(entries)
    return out


class _SplitBody(_Body):
    """One launch of the split-row kernel: Metal's loop schedule (:class:`_Body`, a
    :class:`~tilewright.templates.loop_schedule.LoopSchedule`) with the chunk in place of the
    row. :meth:`phase` builds launch ``p`` from the schedule's own steps: the row variables, a
    :meth:`row_pass` per group of reductions (the row loop hooks walk the chunk), the per-row
    and per-element stores; what is added is the fold of earlier launches' partials and the
    write of this launch's."""

    def __init__(self, kernel: LoopKernel, idx: str, threads: int, plan: Schedule):
        super().__init__(kernel, idx, threads, persistent=False)
        self.plan = plan
        self.combined: dict[int, list[str]] = {}  # id(reduction) -> its threadgroup-combined accumulators

    # -- the schedule's hooks: the chunk is the row ---------------------------------------------
    def open_row_loop(self) -> tuple[str, str]:
        self.e.open(f"for ({self.idx} rindex = cstart + tid; rindex < cend; rindex += ntg)")
        self.in_loop = True
        return "rindex", ""

    def finish_accumulators(self, r: Node, accs: list[str], owner: bool) -> str:
        if owner:  # the chunk's components, written as its partials after the pass
            self.combined[id(r)] = accs
        return super().finish_accumulators(r, accs, owner)

    def write_row_stores(self, stores: list) -> None:
        for s in stores:  # once per row: by the first chunk's first thread
            self.store(s, "chunk == 0 && tid == 0")

    # -- the launches ---------------------------------------------------------------------------
    def phase(self, p: int) -> "_SplitBody":
        """Build launch ``p``: the partials of pass ``p``, or (``p == len(plan.passes)``) the
        outputs. Returns self."""
        k = self.k
        self.decompose("xindex", self.xvars, k.ranges)
        for q in range(p):
            for entry in self.plan.entries[q]:
                self._fold(entry)
        if p == len(self.plan.passes):  # the last launch: the outputs
            row_stores = [s for s in k.stores if not self.on_r(s)]
            element_stores = [s for s in k.stores if self.on_r(s)]
            if row_stores:
                self.write_row_stores(row_stores)
            if element_stores:
                self.open_row()
                for s in element_stores:
                    self.store(s, None)
                self.close_row()
            return self
        plain, sums = self.plan.passes[p]
        self.row_pass(plain)
        if sums:
            for s in sums:  # the online sums: over the same chunk, shifted by its own max
                m = self.plan_entry(s).online_max
                shift = self.e.fresh()
                self.e.line(f"const float {shift} = {self._shift(self.e.names[m])};")
                self.e.bind(m, shift)
            self.row_pass(sums)
        self.e.open("if (tid == 0)")  # the chunk's partials, for the next launch
        for entry in self.plan.entries[p]:
            for part, acc in zip(entry.parts, self.combined[id(entry.nodes[0])]):
                self.e.line(f"{part}[xindex * SPLIT + chunk] = {acc};")
        self.e.close()
        return self

    def _fold(self, entry: Entry) -> None:
        """The row's value of ``entry`` from its SPLIT partials, in chunk order; binds its nodes."""
        red, e = entry.red, self.e
        accs = [e.fresh() for _ in red.types]
        for t, a, ident in zip(red.msl_types, accs, red.identity()):
            e.line(f"{t} {a} = {ident};")
        e.open(f"for ({self.idx} split_c = 0; split_c < SPLIT; ++split_c)")
        if entry.online_max is not None:
            # s_c was summed with the shift m_c (0 for an all -inf chunk): rescale it to M
            m, mc = e.names[entry.online_max], e.fresh()
            e.line(f"const float {mc} = {self._shift(f'{self.plan_max_part(entry)}[xindex * SPLIT + split_c]')};")
            e.line(f"{accs[0]} += {entry.parts[0]}[xindex * SPLIT + split_c] * metal::precise::exp({mc} - {m});")
        else:
            b = [e.fresh() for _ in red.types]
            for t, bi, part in zip(red.msl_types, b, entry.parts):
                e.line(f"const {t} {bi} = {part}[xindex * SPLIT + split_c];")
            e.open("")
            for st in red.combine(accs, b):
                e.line(st)
            e.close()
        e.close()
        for r in entry.nodes:
            if red.kind in ("argmax", "argmin"):
                e.bind(r, f"static_cast<long>({accs[1]})")
            else:
                e.bind(r, accs[1] if r.arg == "welford_m2" else accs[0])

    def plan_max_part(self, entry: Entry) -> str:
        for entries in self.plan.entries:
            for other in entries:
                if entry.online_max in other.nodes:
                    return other.parts[0]
        raise AssertionError("an online sum without its max")

    def plan_entry(self, node: Node) -> Entry:
        return next(e for entries in self.plan.entries for e in entries if node in e.nodes)

    @staticmethod
    def _shift(m: str) -> str:
        """The shift an online sum uses for chunk max ``m``: ``m``, or 0 when it is -inf (an
        all -inf chunk, whose sum is then 0 instead of exp(-inf + inf))."""
        return f"((isinf({m}) && {m} < 0.0f) ? 0.0f : {m})"


class MetalSplitReduction(_MetalLoops):
    """Reductions of few, long rows, each row over ``SPLIT`` threadgroups (module docstring)."""

    id = "metal.split_reduction"
    op = "reduction"
    jinja = "split_reduce.metal.jinja"
    launcher = "split_launcher.py.jinja"
    space = ParamSpace((
        Knob("XBLOCK", (1,), 1, "rows per threadgroup group (one row, SPLIT threadgroups)"),
        Knob("SPLIT", (2, 4, 8, 16, 32, 64, 128), 32, "threadgroups per row, each a contiguous chunk"),
        Knob("num_warps", (4, 8, 16, 32), 8, "simdgroups (32 threads each) per threadgroup"),
        Knob("PERSISTENT", (False,), False, "chunks are looped over, never held in registers"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        base = super().problem_support(problem, target)
        if not base:
            return base
        plan = schedule(problem.kernel)
        buffers = len(problem.kernel.inputs) + len(problem.kernel.outputs) + len(plan.parts) + 1
        if buffers > MAX_BUFFERS:
            return Support(False, f"{buffers} buffers with the partials exceed Metal's {MAX_BUFFERS}: "
                                  f"metal.reduction runs it")
        return base

    def check_tile(self, params: Params, problem: LoopProblem, target: Target) -> str | None:
        threads, split = self.threads(params), params["SPLIT"]
        chunk = -(-max(problem.rnumel, 1) // split)
        if chunk < max(MIN_CHUNK, threads // 2):
            return (f"SPLIT={split} leaves chunks of {chunk} elements for {threads} threads: a smaller "
                    f"SPLIT or fewer simdgroups")
        if problem.xnumel * split * threads > 2**32 - 1:
            return f"{problem.xnumel} rows x {split} chunks of {threads} threads exceed Metal's 32-bit grid"
        smem = max(self._body(problem, params, p).smem_bytes() for p in range(schedule(problem.kernel).launches))
        return threadgroup_refusal(threads, smem, target, fewer_threads="lower num_warps",
                                   less_memory="the reductions' partials need fewer threads (lower num_warps)")

    def seed_params(self, problem: LoopProblem, target: Target) -> list[dict[str, Any]]:
        """Few long rows only (fewer rows than GPU cores, at least 4096 elements each): enough
        chunks for two threadgroups per core, each at least a threadgroup's worth, at 256, 512
        and 1024 threads."""
        r, x = max(problem.rnumel, 1), max(problem.xnumel, 1)
        if r < MIN_ROW or x >= target.num_sms:
            return []
        out = []
        for threads in (256, 512, 1024):
            if threads > min(MAX_THREADS_PER_GROUP, target.max_threads_per_block):
                continue
            split = 2
            while split < 128 and x * split < 2 * target.num_sms and -(-r // (2 * split)) >= max(MIN_CHUNK, threads):
                split *= 2
            out.append({"XBLOCK": 1, "SPLIT": split, "num_warps": threads // SIMD_WIDTH, "PERSISTENT": False})
        return out

    def _body(self, problem: LoopProblem, params: Params, phase: int = 0) -> _SplitBody:  # type: ignore[override]
        return _SplitBody(problem.kernel, "long" if needs_int64(problem) else "int", self.threads(params),
                          schedule(problem.kernel)).phase(phase)

    def render_kernel(self, problem: LoopProblem, params: Params, target: Target) -> RenderedKernel:
        k = problem.kernel
        plan = schedule(k)
        bodies = [self._body(problem, params, p) for p in range(plan.launches)]
        merged = _SplitBody(k, bodies[0].idx, self.threads(params), plan)
        for b in bodies:  # one copy of each helper for every kernel function of the shader
            merged.e.helpers_used |= b.e.helpers_used
            merged.reductions.update(b.reductions)
        names = {s: s.name for s in k.size_symbols()}
        buffers = list(k.inputs) + list(k.outputs)
        strides = [f"{b.name}_s{d}" for b in buffers for d in range(len(b.shape))]
        sizes = [s.name for s in k.size_symbols()]
        meta = strides + sizes + ["xnumel", "rnumel"]
        args = [f"device const {MSL_TYPE[b.dtype]}* {b.name} [[buffer({i})]]" for i, b in enumerate(k.inputs)]
        args += [f"device {MSL_TYPE[b.dtype]}* {b.name} [[buffer({len(k.inputs) + i})]]"
                 for i, b in enumerate(k.outputs)]
        args += [f"device {t}* {name} [[buffer({len(buffers) + i})]]" for i, (name, t) in enumerate(plan.parts)]
        args.append(f"constant long* meta [[buffer({len(buffers) + len(plan.parts)})]]")
        args += ["uint xid [[threadgroup_position_in_grid]]", "uint tid [[thread_position_in_threadgroup]]",
                 "uint ntg [[threads_per_threadgroup]]", "uint lane [[thread_index_in_simdgroup]]",
                 "uint sg [[simdgroup_index_in_threadgroup]]", "uint nsg [[simdgroups_per_threadgroup]]"]
        kernels = [f"tw_split_reduction_p{p}" for p in range(plan.launches)]
        text = dict(problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name)
        shader = self.render_jinja(
            **text, args=args, meta=meta, idx=merged.idx, SPLIT=params["SPLIT"], helpers=merged.helpers(),
            functions=[dict(name=name, smem=b.smem_decls(), body=b.e.lines,
                            what="the outputs" if p == len(plan.passes) else f"partials of pass {p}")
                       for p, (name, b) in enumerate(zip(kernels, bodies))])
        threads = self.threads(params)
        part_torch = {"float": "torch.float32", "int": "torch.int32", "long": "torch.int64", "bool": "torch.bool",
                      "half": "torch.float16", "bfloat": "torch.bfloat16", "uint": "torch.int32"}
        launcher = self.render_jinja_file(self.launcher,
            **text, shader=shader, kernels=kernels, threads=threads, SPLIT=params["SPLIT"],
            inputs=[b.name for b in k.inputs], sizes=sizes, buffers=[b.name for b in buffers],
            outputs=[{"name": b.name, "dtype": str(dtypes.TORCH[b.dtype]),
                      "shape": [code(s, names) for s in b.shape], "stride": [code(s, names) for s in b.stride]}
                     for b in k.outputs],
            parts=[part_torch[t] for _, t in plan.parts],
            xnumel=code(k.xnumel, names), rnumel=code(k.rnumel, names))
        groups = problem.xnumel * params["SPLIT"]
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=launcher,
            name="metal_split_reduction",
            meta={"kind": "reduction", "shader": shader, "kernel": kernels[-1], "kernels": kernels,
                  "meta_args": meta, "threads": groups * threads, "group_size": threads,
                  "launches": plan.launches,
                  "threadgroup_bytes": max(b.smem_bytes() for b in bodies), "persistent": False})

    def expected_launches(self, problem: LoopProblem) -> int:
        """Kernel launches per call: one per pass of partials, one for the outputs."""
        return schedule(problem.kernel).launches


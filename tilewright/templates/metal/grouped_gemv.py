"""``metal.grouped_gemv``: the decode path of ``torch._grouped_mm`` 2-D x 3-D (the MoE forward) on
Apple GPUs, for groups of a few tokens.

With one or a few tokens per expert (decode: each token routed to its top-k experts), the tiled
kernel (:mod:`tilewright.templates.metal.grouped`) pads every group to an 8-row tile, stages the
weights through threadgroup memory in fp32 and waits at two barriers per K step: the work is a
weight stream, and a gemv streams it directly. Here threadgroup (g, column tile) takes group g's
rows and ``BLOCK_N`` output columns, one simdgroup per column; the simdgroup's 32 lanes stride
over K (a Linear's weight stored (N, K), used transposed, is read coalesced) keeping one running
sum per row, ``BLOCK_M`` rows a pass (a larger group takes more passes, so any offsets are
right), ``simd_sum`` folds each row, and lane r finishes row r:

- a fused gated product (``problem.glu``, the MoE gate_up projection's ``act(gate) * up``): the
  simdgroup of output column n also sums the up column n + N/2 from the same A loads;
- the problem's epilogue (:func:`tilewright.ir.epilogue.problem_epilogue`, any pointwise IR)
  by the Metal emitter, per element, with per-group (``B``, ``BN``), per-row (``M``) and
  per-column (``N``) inputs in their natural shapes, then the store in the output type;
- fp8 e4m3 operands (``dtype == "fp8e4m3"``, ``torch._scaled_grouped_mm``'s form) as bytes,
  decoded exactly where loaded (``tw_e4m3``), their scales the epilogue's multiplies (per token
  ``M``, per expert and column ``BN``, per expert ``B``), applied to the fp32 sum.

The offsets are read in the shader (clamped non-decreasing and within M, as the tiled kernel
does), so there is no host copy of them; an empty group's threadgroups return at once. The grid
is G x ceil(N_out / BLOCK_N) threadgroups. Offered for decode-sized problems (at most
``BLOCK_M`` rows per group on average); the policy's cost model weighs it against the tiled
kernel (:mod:`tilewright.kinds.grouped_gemm.policy`), and on a Mac both would be measured.
"""

from __future__ import annotations

import types
from typing import Any

from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.ir import dtypes
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.ir.expr import Node
from tilewright.problem import EpilogueOp
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.metal.emit import MSL_TYPE, MetalExpr, ctype
from tilewright.templates.metal.gemm import (
    E4M3_DECODE, FLOATS, FP8, epilogue_support, operand_load, operand_type,
)
from tilewright.templates.metal.limits import threadgroup_refusal
from tilewright.templates.metal.loops import INDEX_LIMIT
from tilewright.templates.metal.reduce import SIMD_WIDTH

DECODE_ROWS = 8  # offered where groups average at most this many rows (tokens)


def _needs_int64(p: GroupedGemmProblem) -> bool:
    return bool(p.dynamic) or max(p.M * p.K, p.G * p.K * p.N, p.M * p.N) > INDEX_LIMIT


class MetalGroupedGemv(TemplateSpec):
    """Decode grouped GEMM on Apple GPUs; see the module docstring."""

    id = "metal.grouped_gemv"
    backend = "metal"
    op = "grouped_gemm"
    jinja = "grouped_gemv.metal.jinja"
    launcher = "grouped_gemv_launcher.py.jinja"
    fuses_glu = True  # renders problem.glu (the policy offers glu problems only to such templates)
    schedule = "gemv"  # the policy's cost model: a weight stream, not a tiled MMA
    space = ParamSpace((
        Knob("BLOCK_M", (4, 8), 8, "rows one simdgroup sums per pass over the weights"),
        Knob("BLOCK_N", (1, 2, 4, 8, 16), 4, "output columns per threadgroup, one per simdgroup"),
        Knob("BLOCK_K", (32,), 32, "K per lane step: the simdgroup's width"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "simdgroups per threadgroup (= BLOCK_N)"),
        Knob("num_stages", (1,), 1, "K steps in flight"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, "metal.grouped_gemv runs grouped GEMMs (GroupedGemmProblem)")
        if target.backend != "mps":
            return Support(False, "Metal kernels run on the mps target only")
        if problem.case != "2d3d":
            return Support(False, f"the {problem.case} case: the Metal grouped gemv runs the 2-D x 3-D MoE "
                                  f"forward only")
        if problem.dtype not in FLOATS + FP8:
            return Support(False, f"{problem.dtype} operands: the Metal grouped gemv takes fp32, fp16, bf16 "
                                  f"and fp8e4m3 (scales as epilogue multiplies)")
        if problem.out_dtype not in FLOATS:
            return Support(False, f"{problem.out_dtype} output: the Metal grouped gemv writes fp32, fp16 and bf16")
        return epilogue_support(problem, operand_buffers=4)

    def check(self, params: Params, problem: GroupedGemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if params["num_warps"] != params["BLOCK_N"]:
            return "one simdgroup per column: num_warps must equal BLOCK_N"
        if (why := threadgroup_refusal(params["num_warps"] * SIMD_WIDTH, 0, target,
                                       fewer_threads="lower BLOCK_N and num_warps", less_memory="")) is not None:
            return why
        groups = problem.G * -(-problem.out_n // params["BLOCK_N"])
        if groups * params["num_warps"] * SIMD_WIDTH > 2**32 - 1:
            return "the grid exceeds Metal's 32-bit thread count: a larger BLOCK_N"
        return None

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """Decode-sized groups only (at most 8 rows per group on average, over the groups that
        can hold rows): 4 and 8 columns per threadgroup, 8 rows a pass (4 for one-token
        groups, which fold fewer sums)."""
        if problem.M / problem.active_groups > DECODE_ROWS:
            return []
        rows = 4 if problem.M <= problem.active_groups else 8
        return [{"BLOCK_M": rows, "BLOCK_N": w, "BLOCK_K": 32, "num_warps": w, "num_stages": 1} for w in (4, 8)]

    def render_kernel(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        idx = "long" if _needs_int64(problem) else "int"
        n_inputs = len(problem.epilogue_inputs)

        def load(n: Node) -> str:
            k = int(n.arg[0][1:])
            return f"static_cast<{ctype(n.dtype)}>(e{k}[pid_b * se{k}b + m * se{k}m + n * se{k}n])"

        e = MetalExpr(load=load, acc=lambda n: "accv", prefix="ep")
        e.indent = " " * 12  # inside the row pass and the lane's conditional
        value = e.emit(problem_epilogue(problem))
        glu_lines, glu_value = [], ""
        if problem.glu:
            g = MetalExpr(load=load, acc=lambda n: "gatev", prefix="gl")
            g.indent = " " * 12
            glu_value = g.emit(epilogue_expr((EpilogueOp(problem.glu),), ()))
            glu_lines = g.lines
            e.helpers_used |= g.helpers_used  # one copy of each helper for both
        meta = ["M", "N", "K", "G", "sam", "sak", "sbg", "sbk", "sbn", "som", "son"]
        meta += [f"se{k}{d}" for k in range(n_inputs) for d in "bmn"]
        in_type = operand_type(problem.dtype)
        args = [f"device const {in_type}* a [[buffer(0)]]", f"device const {in_type}* b [[buffer(1)]]",
                "device const int* offs [[buffer(2)]]", f"device {MSL_TYPE[problem.out_dtype]}* out [[buffer(3)]]"]
        args += [f"device const {MSL_TYPE[inp.dtype]}* e{k} [[buffer({4 + k})]]"
                 for k, inp in enumerate(problem.epilogue_inputs)]
        args += [f"constant long* meta [[buffer({4 + n_inputs})]]", "uint gid [[threadgroup_position_in_grid]]",
                 "uint lane [[thread_index_in_simdgroup]]", "uint sg [[simdgroup_index_in_threadgroup]]"]
        helpers = "\n\n".join(h for h in (E4M3_DECODE if problem.dtype in FP8 else "", e.helpers()) if h)
        text = dict(problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name)
        kernel = "tw_grouped_gemv"
        shader = self.render_jinja(
            **text, kernel_name=kernel, args=args, meta=meta, idx=idx, helpers=helpers,
            load=operand_load(problem.dtype), in_type=in_type, ROWS=params["BLOCK_M"], BLOCK_N=params["BLOCK_N"],
            glu=problem.glu, glu_lines=glu_lines, glu_value=glu_value, epilogue=e.lines, value=value,
            out_type=MSL_TYPE[problem.out_dtype])
        threads = params["num_warps"] * SIMD_WIDTH
        launcher = self.render_jinja_file(self.launcher,
            **text, shader=shader, kernel_name=kernel, threads=threads, BLOCK_N=params["BLOCK_N"],
            glu=problem.glu, fp8=problem.dtype in FP8, out_dtype=str(dtypes.TORCH[problem.out_dtype]),
            patterns=repr([inp.broadcast for inp in problem.epilogue_inputs]))
        groups = problem.G * -(-problem.out_n // params["BLOCK_N"])
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=launcher,
            name="metal_grouped_gemv",
            meta={"kind": "grouped_gemm", "shader": shader, "kernel": kernel, "meta_args": meta,
                  "threads": groups * threads, "group_size": threads, "threadgroup_bytes": 0})


def grouped_gemv_kernel(problem: GroupedGemmProblem, params: Params | None = None,
                        target: Target | str = "mps") -> types.ModuleType:
    """The rendered launcher module for ``problem``: ``launch(a, b, offs, *epilogue_inputs,
    out=None)``. ``params`` default to the first of ``seed_params`` (4 columns per threadgroup
    when the problem is not decode-sized). On macOS with MPS ``launch`` compiles and runs the
    shader; elsewhere it raises ``EnvironmentMismatchError`` (``tests/metal_host.py`` runs the
    same module on the host).

    Raises:
        UnsupportedProblemError: the problem or the params cannot run on the target (the reason).
    """
    from tilewright.runtime.targets import get_target

    target = get_target(target)
    template = MetalGroupedGemv()
    if params is None:
        params = (template.seed_params(problem, target)
                  or [{"BLOCK_M": 8, "BLOCK_N": 4, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}])[0]
    rendered = template.render(problem, params, target)
    mod = types.ModuleType(rendered.name)
    exec(compile(rendered.source, rendered.name, "exec"), mod.__dict__)
    mod.RENDERED = rendered
    return mod

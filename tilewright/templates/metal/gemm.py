"""``metal.gemm``: ``out = epilogue(A @ B)`` for the ``mps`` target with ``simdgroup_matrix``
8x8 tiles.

One threadgroup per ``BLOCK_M x BLOCK_N`` output tile (and batch). Each step along K stages an
A tile and a B tile through threadgroup memory in fp32, read through run-time strides (any
layout, any batch broadcast), zero past the edges; each simdgroup owns ``(BLOCK_M/8) *
(BLOCK_N/8) / num_warps`` 8x8 accumulators and runs ``simdgroup_multiply_accumulate`` over
``BLOCK_K/8`` sub-steps. The accumulators go through threadgroup memory to the epilogue, which
is the problem's expression IR (:func:`tilewright.ir.epilogue.problem_epilogue`) rendered by the
Metal emitter on each element, then stored with the output's element type. Decode shapes
(M <= 8) take ``BLOCK_M = 8`` tiles, so no rows are wasted (``metal.gemv`` below is the
other decode candidate).

fp8 (``dtype == "fp8e4m3"``, as ``kinds/gemm/lower.py`` builds it from ``aten._scaled_mm``): the
operands are bound as bytes and decoded exactly to fp32 where they are staged (``tw_e4m3``);
the tensor-wise (``""``) or row-wise (``"M"`` for scale_a, ``"N"`` for scale_b) fp32 scales
are the epilogue's multiplies, applied to the fp32 accumulator, which is exact algebra for
these scale shapes: ``(A * sa) @ (B * sb) == sa * sb * (A @ B)``.

Epilogue inputs come broadcast to the output shape (stride 0 where they do not vary), as for
the other GEMM templates: ``launch(a, b, *epilogue_inputs, out=None)``.
"""

from __future__ import annotations

from typing import Any

from tilewright.ir import dtypes
from tilewright.ir.epilogue import problem_epilogue
from tilewright.ir.expr import Node
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import SCALED_FORMATS
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, jinja_env,
)
from tilewright.templates.metal.emit import MSL_TYPE, MetalExpr, ctype, unsupported_dtype
from tilewright.templates.metal.limits import threadgroup_refusal
from tilewright.templates.metal.loops import INDEX_LIMIT, MAX_BUFFERS
from tilewright.templates.metal.reduce import SIMD_WIDTH

FLOATS = ("fp32", "fp16", "bf16")
FP8 = ("fp8e4m3",)  # operands decoded in the shader (below); e5m2 is not written yet

# MSL has no fp8 type: e4m3 operands are bound as bytes and decoded to float where they are
# staged. The decode is exact (every e4m3 value is a float), by bits rather than arithmetic so
# no exp2/ldexp rounding under fast math can touch it.
E4M3_DECODE = """// torch.float8_e4m3fn (OCP e4m3fn) byte -> float, exactly: sign, 4 exponent bits (bias 7),
// 3 mantissa bits; exponent 0 is subnormal (m * 2^-9); S.1111.111 is NaN; no infinities
inline float tw_e4m3(uchar v) {
    const uint e = (uint(v) >> 3) & 15u;
    const uint m = uint(v) & 7u;
    float mag = e == 0u ? float(m) * 0.001953125f : as_type<float>(((e + 120u) << 23) | (m << 20));
    if (e == 15u && m == 7u) mag = NAN;
    return (uint(v) & 128u) != 0u ? -mag : mag;
}"""


def operand_type(dtype: str) -> str:
    """The MSL element type an A/B buffer of ``dtype`` is bound as (bytes for fp8)."""
    return "uchar" if dtype in FP8 else MSL_TYPE[dtype]


def operand_load(dtype: str) -> str:
    """The MSL function turning one A/B element into float (the fp8 decode, or a cast)."""
    return "tw_e4m3" if dtype in FP8 else "static_cast<float>"


def tile_bytes(bm: int, bn: int, bk: int) -> int:
    """Threadgroup memory of one GEMM tile, bytes: the staged A (bm x bk) and B (bk x bn) tiles
    and the accumulator tile (bm x bn) handed to the epilogue, all fp32."""
    return 4 * (bm * bk + bk * bn + bm * bn)


def _needs_int64(p: GemmProblem) -> bool:
    if p.dynamic:
        return True
    return max(p.M * p.K, p.K * p.N, p.M * p.N) * p.batch > INDEX_LIMIT



def epilogue_support(problem: Any, operand_buffers: int) -> Support:
    """Whether a Metal GEMM kernel can take ``problem``'s epilogue: its inputs' dtypes, the
    buffer table (``operand_buffers`` for the operands and sizes, one per epilogue input, one
    for the output) and its IR. Shared by the GEMM and the grouped gemv."""
    for e in problem.epilogue_inputs:
        if (why := unsupported_dtype(e.dtype)) is not None:
            return Support(False, f"epilogue input: {why}")
    if operand_buffers + len(problem.epilogue_inputs) + 1 > MAX_BUFFERS:
        return Support(False, f"over Metal's {MAX_BUFFERS} buffer arguments")
    try:
        problem_epilogue(problem)
    except ValueError as e:
        return Support(False, str(e))
    return SUPPORTED

class MetalGemm(TemplateSpec):
    """GEMM with a fused IR epilogue on Apple GPUs (see the module docstring)."""

    id = "metal.gemm"
    backend = "metal"
    op = "gemm"
    jinja = "gemm.metal.jinja"
    launcher = "gemm_launcher.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (8, 16, 32, 64), 32, "output rows per threadgroup"),
        Knob("BLOCK_N", (8, 16, 32, 64), 32, "output columns per threadgroup"),
        Knob("BLOCK_K", (8, 16, 32), 16, "K per staged step"),
        Knob("num_warps", (1, 2, 4, 8), 4, "simdgroups (32 threads each) per threadgroup"),
        Knob("num_stages", (1,), 1, "K steps in flight (one: each step waits for its staged tiles)"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GemmProblem):
            return Support(False, "metal.gemm runs GEMMs")
        if target.backend != "mps":
            return Support(False, "Metal kernels run on the mps target only")
        if problem.dtype in SCALED_FORMATS or problem.dtype not in FLOATS + FP8:
            return Support(False, f"{problem.dtype} operands: the Metal GEMM takes fp32, fp16, bf16 and "
                                  f"fp8e4m3 (tensor- or row-wise scales as epilogue multiplies); run it on ATen")
        if problem.out_dtype not in FLOATS:
            return Support(False, f"{problem.out_dtype} output: the Metal GEMM writes fp32, fp16 and bf16")
        if problem.store_acc:
            return Support(False, "storing the product beside the epilogue (store_acc) is not in the Metal GEMM yet")
        return epilogue_support(problem, operand_buffers=3)

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        bm, bn, bk, w = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"]
        tiles = (bm // 8) * (bn // 8)
        if tiles % w:
            return f"{tiles} 8x8 tiles do not split over {w} simdgroups"
        if (why := threadgroup_refusal(w * SIMD_WIDTH, tile_bytes(bm, bn, bk), target,
                                       fewer_threads="lower num_warps",
                                       less_memory="smaller BLOCK_M, BLOCK_N or BLOCK_K")) is not None:
            return why
        groups = -(-problem.M // bm) * -(-problem.N // bn) * problem.batch
        if groups * w * SIMD_WIDTH > 2**32 - 1:
            return "the grid exceeds Metal's 32-bit thread count"
        return None

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        """Thin 8-row tiles for decode (M <= 8), square-ish tiles otherwise."""
        if problem.M <= 8:
            seeds = [(8, 64, 32, 2), (8, 32, 32, 1), (8, 64, 16, 4)]
        else:
            seeds = [(32, 32, 16, 4), (64, 64, 16, 8), (32, 64, 32, 4), (64, 32, 16, 4), (16, 32, 32, 2)]
        return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 1}
                for bm, bn, bk, w in seeds]

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        return self._render(problem, params, target, "tw_gemm", per_group_n=params["BLOCK_N"],
                            per_group_m=params["BLOCK_M"])

    def _render(self, problem: GemmProblem, params: dict, target: Target, kernel: str, *,
                per_group_n: int, per_group_m: int | None) -> RenderedKernel:
        """The shader and launcher; a threadgroup covers ``per_group_m`` rows (None: all M)
        by ``per_group_n`` columns."""
        idx = "long" if _needs_int64(problem) else "int"
        n_inputs = len(problem.epilogue_inputs)

        def load(n: Node) -> str:
            k = int(n.arg[0][1:])
            return f"static_cast<{ctype(n.dtype)}>(e{k}[pid_b * se{k}b + m * se{k}m + n * se{k}n])"

        e = MetalExpr(load=load, acc=lambda n: "accv", prefix="ep")
        e.indent = " " * (12 if per_group_m is not None else 8)  # inside the epilogue's conditional
        value = e.emit(problem_epilogue(problem))
        meta = ["M", "N", "K", "sab", "sam", "sak", "sbb", "sbk", "sbn", "sob", "som", "son"]
        meta += [f"se{k}{d}" for k in range(n_inputs) for d in "bmn"]
        args = [f"device const {operand_type(problem.dtype)}* a [[buffer(0)]]",
                f"device const {operand_type(problem.dtype)}* b [[buffer(1)]]",
                f"device {MSL_TYPE[problem.out_dtype]}* out [[buffer(2)]]"]
        args += [f"device const {MSL_TYPE[inp.dtype]}* e{k} [[buffer({3 + k})]]"
                 for k, inp in enumerate(problem.epilogue_inputs)]
        args += [f"constant long* meta [[buffer({3 + n_inputs})]]", "uint gid [[threadgroup_position_in_grid]]"]
        if per_group_m is None:  # gemv: lanes and simdgroups
            args += ["uint lane [[thread_index_in_simdgroup]]", "uint sg [[simdgroup_index_in_threadgroup]]"]
        else:
            args += ["uint tid [[thread_position_in_threadgroup]]", "uint ntg [[threads_per_threadgroup]]",
                     "uint sg [[simdgroup_index_in_threadgroup]]"]
        bm, bn, bk, w = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"]
        text = dict(problem_text=f"{problem.op} {problem.M}x{problem.N}x{problem.K} {problem.dtype} "
                                 f"{problem.describe_epilogue()}",
                    params_text=self.space.encode(params), target=target.name)
        shader = self.render_jinja(
            **text, kernel_name=kernel, args=args, meta=meta, idx=idx,
            helpers="\n\n".join(h for h in ((E4M3_DECODE if problem.dtype in FP8 else ""), e.helpers()) if h),
            load=operand_load(problem.dtype),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, per_sg=(bm // 8) * (bn // 8) // w,
            epilogue=e.lines, value=value, out_type=MSL_TYPE[problem.out_dtype])
        threads = w * SIMD_WIDTH
        launcher = jinja_env(self.folder).get_template(self.launcher).render(
            **text, shader=shader, kernel_name=kernel, threads=threads,
            BLOCK_M=per_group_m if per_group_m is not None else 0, BLOCK_N=per_group_n,
            out_dtype=str(dtypes.TORCH[problem.out_dtype]), fp8=problem.dtype in FP8)
        rows = -(-problem.M // per_group_m) if per_group_m is not None else 1
        groups = rows * -(-problem.N // per_group_n) * problem.batch
        smem = tile_bytes(bm, bn, bk) if per_group_m is not None else 0
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=launcher,
            name=f"metal_{kernel[3:]}",
            meta={"kind": "gemm", "shader": shader, "kernel": kernel, "meta_args": meta,
                  "threads": groups * threads, "group_size": threads, "threadgroup_bytes": smem})


class MetalGemv(MetalGemm):
    """Decode GEMMs (M <= 8): one simdgroup per output column, ``simd_sum`` over K, the IR
    epilogue on lane m for row m. ``BLOCK_N`` columns (= simdgroups) per threadgroup; the tile
    knobs of the GEMM family are kept so tables and caches read alike (``BLOCK_M`` is the 8 rows
    one simdgroup sums, ``BLOCK_K`` the 32 lanes' stride along K)."""

    id = "metal.gemv"
    jinja = "gemv.metal.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (8,), 8, "rows one simdgroup sums at once (M <= 8)"),
        Knob("BLOCK_N", (1, 2, 4, 8, 16), 4, "output columns per threadgroup, one per simdgroup"),
        Knob("BLOCK_K", (32,), 32, "K per lane step: the simdgroup's width"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "simdgroups per threadgroup (= BLOCK_N)"),
        Knob("num_stages", (1,), 1, "K steps in flight"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if isinstance(problem, GemmProblem) and (problem.M > 8 or "M" in problem.dynamic):
            return Support(False, "the gemv path is for decode shapes, M <= 8 (and M not dynamic)")
        return super().problem_support(problem, target)

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if params["num_warps"] != params["BLOCK_N"]:
            return "one simdgroup per column: num_warps must equal BLOCK_N"
        if (why := threadgroup_refusal(params["num_warps"] * SIMD_WIDTH, 0, target,
                                       fewer_threads="lower BLOCK_N and num_warps", less_memory="")) is not None:
            return why
        groups = -(-problem.N // params["BLOCK_N"]) * problem.batch
        if groups * params["num_warps"] * SIMD_WIDTH > 2**32 - 1:
            return "the grid exceeds Metal's 32-bit thread count"
        return None

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        return [{"BLOCK_M": 8, "BLOCK_N": w, "BLOCK_K": 32, "num_warps": w, "num_stages": 1} for w in (4, 8, 2)]

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        return self._render(problem, params, target, "tw_gemv", per_group_n=params["BLOCK_N"], per_group_m=None)

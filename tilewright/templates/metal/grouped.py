"""``metal.grouped_gemm``: ``torch._grouped_mm`` (``F.grouped_mm``) 2-D x 3-D on Apple GPUs, the
mixture-of-experts forward.

``a`` (M, K) holds every token routed to some expert, sorted by expert; ``b`` (G, K, N) one
weight per expert (group); ``offs`` (G,) int32 the cumulative end offsets, so group g owns rows
``offs[g-1] <= m < offs[g]`` (``offs[-1] = 0``) and ``out[m] = a[m] @ b[g]``, out (M, N).
Empty groups (``offs[g] == offs[g-1]``) are allowed.

Each group's rows are cut into ``BLOCK_M``-row tiles (8 rows for decode-sized groups), laid end to
end over the groups; a threadgroup maps its slot to the group that owns it by walking the offsets
buffer, so the launch needs no host copy of the offsets (on MPS that would be a sync per MoE
layer). The grid has ``ceil(M / BLOCK_M) + G`` slots, enough for any offsets; spare slots return.
Each tile is then the ``metal.gemm`` tile: A and B staged in fp32 through threadgroup memory,
``simdgroup_matrix`` 8x8 multiply-accumulates, rows outside the group masked to zero on load and
never stored.

The problem is :class:`tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem` (the "grouped_gemm" kind the
graph lowering makes of ``aten._grouped_mm``), so on the ``mps`` target a model's MoE layers
reach this template like any other. Not here yet: an epilogue or a fused gated product (those
problems are refused, and run on the ATen template), fp8 operands, and the 3-D x 2-D /
2-D x 2-D / 3-D x 3-D cases.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from tilewright.errors import UnsupportedProblemError
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.ir import dtypes
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, jinja_env,
)
from tilewright.templates.metal.emit import MSL_TYPE
from tilewright.templates.metal.gemm import FLOATS, tile_bytes
from tilewright.templates.metal.limits import threadgroup_refusal
from tilewright.templates.metal.loops import INDEX_LIMIT
from tilewright.templates.metal.reduce import SIMD_WIDTH


def _needs_int64(p: GroupedGemmProblem) -> bool:
    return bool(p.dynamic) or max(p.M * p.K, p.G * p.K * p.N, p.M * p.N) > INDEX_LIMIT


class MetalGroupedGemm(TemplateSpec):
    """Grouped GEMM (MoE forward) on Apple GPUs; see the module docstring."""

    id = "metal.grouped_gemm"
    backend = "metal"
    op = "grouped_gemm"
    jinja = "grouped_gemm.metal.jinja"
    launcher = "grouped_launcher.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (8, 16, 32, 64), 8, "rows of one group per threadgroup"),
        Knob("BLOCK_N", (8, 16, 32, 64), 32, "output columns per threadgroup"),
        Knob("BLOCK_K", (8, 16, 32), 32, "K per staged step"),
        Knob("num_warps", (1, 2, 4, 8), 2, "simdgroups (32 threads each) per threadgroup"),
        Knob("num_stages", (1,), 1, "K steps in flight (one: each step waits for its staged tiles)"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, "metal.grouped_gemm runs grouped GEMMs (GroupedGemmProblem)")
        if target.backend != "mps":
            return Support(False, "Metal kernels run on the mps target only")
        if problem.case != "2d3d":
            return Support(False, f"the {problem.case} case: the Metal grouped GEMM runs the 2-D x 3-D "
                                  f"MoE forward only")
        if problem.epilogue or problem.epilogue_ir or problem.glu:
            return Support(False, "a fused epilogue or gated product: the Metal grouped GEMM has none yet")
        if problem.dtype not in FLOATS:
            return Support(False, f"{problem.dtype} operands: the Metal grouped GEMM takes fp32, fp16 and bf16")
        if problem.out_dtype not in FLOATS:
            return Support(False, f"{problem.out_dtype} output: the Metal grouped GEMM writes fp32, fp16 and bf16")
        return SUPPORTED

    def check(self, params: Params, problem: GroupedGemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        bm, bn, bk, w = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"]
        tiles = (bm // 8) * (bn // 8)
        if tiles % w:
            return f"{tiles} 8x8 tiles do not split over {w} simdgroups: fewer num_warps or a larger tile"
        if (why := threadgroup_refusal(w * SIMD_WIDTH, tile_bytes(bm, bn, bk), target,
                                       fewer_threads="lower num_warps",
                                       less_memory="smaller BLOCK_M, BLOCK_N or BLOCK_K")) is not None:
            return why
        slots = -(-problem.M // bm) + problem.G
        if slots * -(-problem.N // bn) * w * SIMD_WIDTH > 2**32 - 1:
            return "the grid exceeds Metal's 32-bit thread count: a larger tile"
        return None

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """8-row tiles when groups average 16 rows or fewer (decode MoE: a few tokens per
        expert, where a taller tile would mostly be masked), taller ones beside them otherwise."""
        per_group = problem.M / max(problem.G, 1)
        seeds = [(8, 64, 32, 2), (8, 32, 32, 1)]
        if per_group > 16:
            seeds = [(32, 32, 16, 4), (64, 64, 16, 8), (16, 64, 32, 4)] + seeds
        return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 1}
                for bm, bn, bk, w in seeds]

    def render_kernel(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        bm, bn, bk, w = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["num_warps"]
        idx = "long" if _needs_int64(problem) else "int"
        kernel = "tw_grouped_gemm"
        meta = ["M", "N", "K", "G", "sam", "sak", "sbg", "sbk", "sbn", "som", "son"]
        in_type, out_type = MSL_TYPE[problem.dtype], MSL_TYPE[problem.out_dtype]
        args = [f"device const {in_type}* a [[buffer(0)]]", f"device const {in_type}* b [[buffer(1)]]",
                "device const int* offs [[buffer(2)]]", f"device {out_type}* out [[buffer(3)]]",
                "constant long* meta [[buffer(4)]]", "uint gid [[threadgroup_position_in_grid]]",
                "uint tid [[thread_position_in_threadgroup]]", "uint ntg [[threads_per_threadgroup]]",
                "uint sg [[simdgroup_index_in_threadgroup]]"]
        text = dict(problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name)
        shader = self.render_jinja(**text, kernel_name=kernel, args=args, meta=meta, idx=idx,
                                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, per_sg=(bm // 8) * (bn // 8) // w,
                                   in_type=in_type, out_type=out_type)
        threads = w * SIMD_WIDTH
        launcher = jinja_env(self.folder).get_template(self.launcher).render(
            **text, shader=shader, kernel_name=kernel, threads=threads, BLOCK_M=bm, BLOCK_N=bn,
            out_dtype=str(dtypes.TORCH[problem.out_dtype]))
        groups = (-(-problem.M // bm) + problem.G) * -(-problem.N // bn)
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=launcher,
            name="metal_grouped_gemm",
            meta={"kind": "grouped_gemm", "shader": shader, "kernel": kernel, "meta_args": meta,
                  "threads": groups * threads, "group_size": threads,
                  "threadgroup_bytes": tile_bytes(bm, bn, bk)})


def grouped_gemm_kernel(problem: GroupedGemmProblem, params: Params | None = None,
                        target: Target | str = "mps") -> types.ModuleType:
    """The rendered launcher module for ``problem``: ``launch(a, b, offs, out=None)``.

    ``params`` default to the first setting of ``seed_params`` that passes ``check``. On macOS
    with MPS ``launch`` compiles and runs the shader; elsewhere it raises
    ``EnvironmentMismatchError`` (``tests/metal_host.py`` runs the same module on the host).

    Raises:
        UnsupportedProblemError: the problem or the params cannot run on the target (the reason).
    """
    from tilewright.runtime.targets import get_target

    target = get_target(target)
    template = MetalGroupedGemm()
    if params is None:
        legal = [p for p in template.seed_params(problem, target) if template.check(p, problem, target) is None]
        if not legal:
            raise UnsupportedProblemError(f"no legal metal.grouped_gemm setting for {problem.describe()}")
        params = legal[0]
    rendered = template.render(problem, params, target)
    mod = types.ModuleType(rendered.name)
    exec(compile(rendered.source, rendered.name, "exec"), mod.__dict__)
    mod.RENDERED = rendered
    return mod


def grouped_mm_reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs)`` in float64 (rows past ``offs[-1]`` are zero): a (M, K),
    b (G, K, N), offs (G,) cumulative end offsets."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].double() @ b[g].double()
        start = end
    return out

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

Not here yet: an epilogue, fp8 operands, the 3-D x 2-D / 2-D x 2-D / 3-D x 3-D forms, and the
lowering of ``aten._grouped_mm`` in ``compiler/lower.py`` (its own issue): the kernel is reached
through :func:`grouped_gemm_kernel` or the template.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tilewright.errors import UnsupportedProblemError
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


@dataclass(frozen=True)
class GroupedGemmProblem:
    """A grouped GEMM as the Metal template sees it (``torch._grouped_mm`` 2-D x 3-D).

    Attributes:
        M: rows of ``a`` and ``out``: the tokens of all groups (the size it is tuned at).
        N, K: columns of ``out``; the reduced dim.
        groups: G, the number of weight matrices (experts).
        dtype: ``a`` and ``b`` element type ("fp32", "fp16", "bf16").
        out_dtype: ``out`` element type (default: ``dtype``, as torch returns).
        layout_b: "row" (each ``b[g]`` N-contiguous) or "col" (K-contiguous: a (G, N, K) weight
            transposed); strides are run-time arguments either way, this is for display.
        dynamic: dims ("M", "N", "K", "groups") that vary at run time (64-bit index math).
    """

    M: int
    N: int
    K: int
    groups: int
    dtype: str
    out_dtype: str = ""
    layout_b: str = "row"
    dynamic: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.out_dtype:
            object.__setattr__(self, "out_dtype", self.dtype)
        for name in ("M", "N", "K", "groups"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"GroupedGemmProblem.{name} must be a non-negative int, got {v!r}")

    @property
    def flops(self) -> int:
        """2 per multiply-add: every row meets exactly one group's weight."""
        return 2 * self.M * self.N * self.K

    def describe(self) -> str:
        cast = f"→{self.out_dtype}" if self.out_dtype != self.dtype else ""
        return f"grouped_mm {self.M}x{self.N}x{self.K} G={self.groups} {self.dtype}{cast} B:{self.layout_b}"


def _needs_int64(p: GroupedGemmProblem) -> bool:
    return bool(p.dynamic) or max(p.M * p.K, p.groups * p.K * p.N, p.M * p.N) > INDEX_LIMIT


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

    @property
    def render_sources(self) -> tuple[Path, ...]:  # the launcher template shapes the output too
        from tilewright.templates.base import _jinja_closure

        return tuple(sorted(set(super().render_sources) | _jinja_closure(self.folder, self.launcher)))

    def supports(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, "metal.grouped_gemm runs grouped GEMMs (GroupedGemmProblem)")
        if target.backend != "mps":
            return Support(False, "Metal kernels run on the mps target only")
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
        slots = -(-problem.M // bm) + problem.groups
        if slots * -(-problem.N // bn) * w * SIMD_WIDTH > 2**32 - 1:
            return "the grid exceeds Metal's 32-bit thread count: a larger tile"
        return None

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """8-row tiles when groups average 16 rows or fewer (decode MoE: a few tokens per
        expert, where a taller tile would mostly be masked), taller ones beside them otherwise."""
        per_group = problem.M / max(problem.groups, 1)
        seeds = [(8, 64, 32, 2), (8, 32, 32, 1)]
        if per_group > 16:
            seeds = [(32, 32, 16, 4), (64, 64, 16, 8), (16, 64, 32, 4)] + seeds
        return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": 1}
                for bm, bn, bk, w in seeds]

    def render(self, problem: GroupedGemmProblem, params: Params, target: Target) -> RenderedKernel:
        params = self.space.complete(params)
        if not (support := self.supports(problem, target)):
            raise UnsupportedProblemError(f"metal.grouped_gemm cannot run {problem.describe()}: {support.reason}")
        if (why := self.check(params, problem, target)) is not None:
            raise UnsupportedProblemError(f"metal.grouped_gemm params {dict(params)} on {target.name}: {why}")
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
        groups = (-(-problem.M // bm) + problem.groups) * -(-problem.N // bn)
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

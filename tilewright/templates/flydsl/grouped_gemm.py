"""The FlyDSL ragged grouped GEMM for gfx950 (``flydsl.grouped_gemm``): the MoE forward,
``_grouped_mm`` case 2d3d, with the fused epilogue.

A (T, K) tokens sorted by group, B (G, N, K) expert weights K-contiguous (``layout_b ==
"col"``: the (G, K, N) operand ``_grouped_mm`` takes, as a transposed view of (G, N, K)
storage), int32 end offsets ``offs`` (G,) read on the device, output (T, N). Group g owns rows
``[offs[g-1], offs[g])``; empty groups are allowed and have no tiles.

Each workgroup takes one (M tile, N tile) work item: the M tiles of all groups in order (group g
has ceil(rows_g / BLOCK_M) of them), found by scanning ``offs`` on the device; a workgroup past
the last tile stores nothing (the grid, ceil(T / BLOCK_M) + G M tiles, is sized without reading
the offsets). The A view starts at the group's first row (groups are not tile-aligned), B is
the group's (N, K) slice, and the K loop is the dense template's (shared jinja macros,
``mainloop.py.jinja``). Rows past the group's end are masked in the epilogue; per-group
epilogue inputs (patterns "B", "BN") are read at the group.

Refused with the reason: the 2d2d, 3d2d and 3d3d cases, B N-contiguous, a fused gated product
(``glu``), K dynamic or not a multiple of BLOCK_K. Launched like
:mod:`tilewright.templates.flydsl.gemm` (``launch(a, b, offs, *epilogue_inputs, out=None)``);
the index math is proven in torch form by :mod:`tilewright.templates.flydsl.emulate`, the
kernel is compile-checked only and has not run on a gfx950.
"""

from __future__ import annotations

from typing import Any

from tilewright.errors import UnsupportedProblemError
from tilewright.kinds.grouped_gemm.problem import GroupedGemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.flydsl import limits
from tilewright.templates.flydsl.gemm import (
    AB_DTYPES, INPUT_DTYPES, INT32_MAX, OUT_DTYPES, FlyDslGemm, LaunchedWhereInstalled, mfma_check,
)


class FlyDslGroupedGemm(LaunchedWhereInstalled, TemplateSpec):
    """Ragged grouped GEMM (MoE forward) through the dense template's MFMA main loop."""

    id = "flydsl.grouped_gemm"
    backend = "flydsl"
    op = "grouped_gemm"
    jinja = "grouped_gemm.py.jinja"
    kernel_name = "tw_flydsl_grouped_gemm"
    space = ParamSpace((
        Knob("BLOCK_M", (32, 64, 128, 256), 64, "rows of a group's output per workgroup"),
        Knob("BLOCK_N", (32, 64, 128, 256), 128, "columns per workgroup"),
        Knob("BLOCK_K", (32, 64, 128), 64, "K slab per LDS buffer"),
        Knob("num_warps", (4, 8), 4, "waves (64 lanes) per workgroup"),
        Knob("num_stages", (2, 3, 4), 2, "LDS buffers in the K ring"),
        Knob("INTERLEAVE", (False, True), False, "overlap half-slab LDS reads with MFMAs"),
    ))

    def problem_support(self, problem: Any, target: Target) -> Support:
        """Whether this template renders ``problem`` for ``target`` (the toolchain is the language's check)."""
        if not isinstance(problem, GroupedGemmProblem):
            return Support(False, f"{self.id} runs grouped GEMMs (tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem)")
        if target.arch != limits.ARCH:
            return Support(False, f"{self.id} is written for {limits.ARCH}, not {target.name}")
        if problem.case != "2d3d":
            return Support(False, f"case {problem.case}: only the MoE forward (2d3d: A (T, K), B (G, K, N), "
                                  "offsets along T) is implemented here; triton.grouped_gemm runs the others")
        if problem.dtype not in AB_DTYPES:
            return Support(False, f"input dtype {problem.dtype} (takes bf16, fp16)")
        if problem.out_dtype not in OUT_DTYPES:
            return Support(False, f"output dtype {problem.out_dtype}")
        if problem.glu:
            return Support(False, "a fused gated product (glu) is not implemented in the FlyDSL kernel")
        if problem.layout_a != "row" or problem.layout_b != "col":
            return Support(False, f"layouts A:{problem.layout_a} B:{problem.layout_b}: the kernel reads A (T, K) "
                                  "and each expert's B as (N, K), K-contiguous (A:row B:col)")
        if "K" in problem.dynamic or problem.K % limits.MFMA_K:
            return Support(False, f"K={problem.K}{' (dynamic)' if 'K' in problem.dynamic else ''}: the K tail "
                                  f"is not masked, K must be a static multiple of {limits.MFMA_K}")
        for inp in problem.epilogue_inputs:
            if inp.broadcast not in ("", "M", "N", "MN", "B", "BN"):
                return Support(False, f"epilogue input pattern {inp.broadcast!r} (takes '', M, N, MN, B, BN)")
            if inp.dtype not in INPUT_DTYPES:
                return Support(False, f"epilogue input dtype {inp.dtype}")
        if max(problem.M * problem.K, problem.G * problem.N * problem.K, problem.M * problem.N) * 4 > INT32_MAX:
            return Support(False, "an operand over 2 GiB (buffer descriptors take 32-bit byte offsets)")
        try:
            FlyDslGemm().epilogue_code(problem)
        except (UnsupportedProblemError, ValueError, KeyError) as e:
            return Support(False, f"epilogue not expressible in FlyDSL: {e}")
        return SUPPORTED

    def check(self, params: Params, problem: GroupedGemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if problem.K % params["BLOCK_K"]:
            return f"K={problem.K} is not a multiple of BLOCK_K={params['BLOCK_K']} (the K tail is not masked)"
        return limits.tile_refusal(params, ELEMENT_BYTES[problem.dtype])

    def seed_params(self, problem: GroupedGemmProblem, target: Target) -> list[dict[str, Any]]:
        """64-row tiles for the few tokens an expert gets in decode and small batches, 128-row
        ones when groups average 128 rows or more; illegal ones dropped."""
        per_group = problem.M // max(problem.G, 1)
        seeds = [dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
                 dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=2)]
        if per_group >= 128:
            seeds.insert(0, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=2, INTERLEAVE=True))
        out = [self.space.complete(s) for s in seeds]
        return [p for p in out if self.check(p, problem, target) is None]

    def render_kernel(self, problem: Any, params: Params, target: Target) -> RenderedKernel:
        lines, out_value, helpers = FlyDslGemm().epilogue_code(problem)
        wm, wn = limits.wave_grid(params["num_warps"])
        ab_fx, ab_torch = AB_DTYPES[problem.dtype]
        T, N, K = FlyDslGemm.aot_sizes(problem)  # placeholders: sizes are run-time values
        G = problem.G
        inputs = []
        for k, inp in enumerate(problem.epilogue_inputs):
            shape = {"B": G, "M": T, "N": N}
            strides, size = {}, 1
            for d in reversed(inp.broadcast):  # natural shapes, contiguous
                strides[d] = size
                size *= shape[d]
            natural = "(" + "".join(f"{shape[d]}, " for d in inp.broadcast) + ")"
            inputs.append(dict(index=k, numel=size, torch=OUT_DTYPES[inp.dtype], pattern=inp.broadcast,
                               natural=natural, sb=strides.get("B", 0), sm=strides.get("M", 0),
                               sn=strides.get("N", 0)))
        source = self.render_jinja(
            problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name,
            kernel_name=self.kernel_name, ab_fx=ab_fx, ab_torch=ab_torch,
            out_torch=OUT_DTYPES[problem.out_dtype], THREADS=params["num_warps"] * limits.WAVE,
            WM=wm, WN=wn, epilogue_lines=lines, out_value=out_value, helpers=helpers, inputs=inputs,
            aot_M=T, aot_N=N, aot_K=K, aot_G=G, **params)
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name=self.kernel_name, language="flydsl",
            meta={"kind": self.op, "language": "flydsl",
                  "lds_bytes": limits.lds_bytes(params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"],
                                                params["num_stages"], ELEMENT_BYTES[problem.dtype])},
            aot=AotSpec(self.kernel_name, "flydsl", {}, {}, (), {"gpu_arch": target.arch}))

    def expected_instructions(self, problem: Any, params: Params, target: Target) -> list[InstructionCheck]:
        if target.arch != limits.ARCH:
            return []
        return [mfma_check(problem.dtype)]

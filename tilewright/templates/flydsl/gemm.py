"""The FlyDSL dense GEMM for gfx950 (``flydsl.gemm``): ``C = epilogue(A @ B^T)`` with A (M, K)
and B (N, K) bf16/fp16, K-contiguous (B as ``nn.Linear`` stores its weight), fp32 accumulation
on ``v_mfma_f32_16x16x32_{bf16,f16}``, the problem's IR epilogue fused.

Kernel (``gemm.py.jinja`` + the shared ``mainloop.py.jinja``), written with FlyDSL's layout API:
one workgroup per BLOCK_M x BLOCK_N tile of C (the 1-D grid GROUP_M-swizzled), num_warps waves
of 64 lanes laid out 2x2 or 4x2 over the tile, each repeating the 16x16x32 MFMA atom. The K
loop keeps ``num_stages`` LDS buffers: slab k + num_stages - 1 is copied global -> LDS by
asynchronous 128-bit buffer DMA (``buffer_load_dwordx4 ... lds``, one async group per slab)
while slab k is read into MFMA fragments (``ds_read_b128``) and multiplied. INTERLEAVE splits
each slab into 32-deep halves (reads of one overlapping MFMAs of the other) and issues the
next slab's B copy after the first half's MFMAs, pinned with a scheduling barrier. After the loop the accumulator
goes through LDS (fp32, reusing the ring's bytes) and each lane runs the epilogue over elements
``tid, tid + THREADS, ...`` of the tile with explicit (m, n), masked at the M/N edges, storing
``C[m, n]`` in the output dtype.

Edges: rows/columns past M or N read zeros (buffer descriptors carry the operands' sizes) and
are never stored; the K tail is not masked, so K must be a static multiple of BLOCK_K.

The module's ``launch(a, b, *epilogue_inputs, out=None)`` runs it on a ROCm gfx950 device on
torch's current stream (:mod:`tilewright.templates.flydsl.launch`); ``tilewright aot --target
gfx950`` builds it through the same ``launch`` compile-only (:mod:`tilewright.templates.flydsl.runtime`).
The index math is proven in torch form by :mod:`tilewright.templates.flydsl.emulate`; the kernel
is compile-checked only, and has not run on a gfx950.
"""

from __future__ import annotations

from typing import Any

from tilewright.errors import UnsupportedProblemError
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.aot import AotSpec
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec,
)
from tilewright.templates.flydsl import limits

AB_DTYPES = {"bf16": ("BFloat16", "torch.bfloat16"), "fp16": ("Float16", "torch.float16")}
OUT_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
INPUT_DTYPES = OUT_DTYPES
INT32_MAX = 2**31 - 1  # buffer offsets are 32-bit byte offsets
PLACEHOLDER_MAX = 512  # largest side of a compile_aot placeholder tensor


class LaunchedWhereInstalled:
    """Mixin of the FlyDSL templates: each rendered module's ``launch`` maps torch tensors onto
    its ``@flyc.jit`` host function and runs it on the current stream
    (:mod:`tilewright.templates.flydsl.launch`), so a compiled model on gfx950 is offered them.
    Where the language is unavailable (FlyDSL or its ROCm linker folder missing: the FlyDSL
    ``Language.unavailable`` check) nothing can launch them, so they are ``aot_only`` (built by
    ``tilewright aot`` only, never a compiled model's candidate) for the reason
    :attr:`aot_only_reason` gives, the one their ``supports`` refuses with."""

    @property
    def aot_only_reason(self) -> str | None:
        """Why no rendered module can launch here (the language's check), or None."""
        return self.language.check()  # type: ignore[attr-defined]

    @property
    def aot_only(self) -> bool:  # type: ignore[override]
        return self.aot_only_reason is not None


def greater_than(n: int) -> str:
    """A regular expression matching a decimal integer greater than ``n`` (whole token)."""
    s = str(n)
    alts = [rf"[1-9]\d{{{len(s)},}}"]  # more digits
    for i, d in enumerate(s):
        if d != "9":
            alts.append(rf"{s[:i]}[{int(d) + 1}-9]\d{{{len(s) - i - 1}}}")
    return r"(?:" + "|".join(alts) + r")\b"


def mfma_check(dtype: str) -> InstructionCheck:
    """The MFMA, the async LDS DMA, LDS within gfx950's 160 KiB, no scratch (spills)."""
    name = {"bf16": "v_mfma_f32_16x16x32_bf16", "fp16": "v_mfma_f32_16x16x32_f16"}[dtype]
    return InstructionCheck(
        "amdgcn", (name, r"buffer_load_dwordx4 [^\n]* lds"),
        (r"scratch_", r"\.amdhsa_private_segment_fixed_size\s+[1-9]",
         r"\.amdhsa_group_segment_fixed_size\s+" + greater_than(limits.LDS_BYTES)),
        f"{name} fed by async buffer->LDS DMA, LDS within {limits.LDS_BYTES} B, no spills")


class FlyDslGemm(LaunchedWhereInstalled, TemplateSpec):
    """gfx950 MFMA GEMM through a num_stages LDS ring, the IR epilogue fused."""

    id = "flydsl.gemm"
    backend = "flydsl"
    op = "gemm"
    jinja = "gemm.py.jinja"
    kernel_name = "tw_flydsl_gemm"
    space = ParamSpace((
        Knob("BLOCK_M", (32, 64, 128, 256), 128, "rows of C per workgroup"),
        Knob("BLOCK_N", (32, 64, 128, 256), 128, "columns of C per workgroup"),
        Knob("BLOCK_K", (32, 64, 128), 64, "K slab per LDS buffer"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "block rows per swizzle group"),
        Knob("num_warps", (4, 8), 4, "waves (64 lanes) per workgroup"),
        Knob("num_stages", (2, 3, 4), 2, "LDS buffers in the K ring (slabs in flight + 1)"),
        Knob("INTERLEAVE", (False, True), False, "overlap the LDS reads of one 32-deep half-slab "
                                                 "with the MFMAs of the other"),
    ))

    # -- what can run ------------------------------------------------------------------------
    def problem_support(self, problem: Any, target: Target) -> Support:
        """Whether this template renders ``problem`` for ``target`` (the toolchain is the language's check)."""
        if not isinstance(problem, GemmProblem):
            return Support(False, f"{self.id} runs GEMM problems")
        if target.arch != limits.ARCH:
            return Support(False, f"{self.id} is written for {limits.ARCH}, not {target.name}")
        if problem.block_scaled or problem.dtype not in AB_DTYPES:
            return Support(False, f"input dtype {problem.dtype} (takes bf16, fp16)")
        if problem.out_dtype not in OUT_DTYPES:
            return Support(False, f"output dtype {problem.out_dtype} (takes {', '.join(OUT_DTYPES)})")
        if problem.store_acc:
            return Support(False, f"{self.id} does not store the product beside its epilogue")
        if problem.batched or problem.batch != 1:
            return Support(False, "batched GEMMs are not implemented here")
        if problem.layout_a != "row" or problem.layout_b != "col":
            return Support(False, f"layouts A:{problem.layout_a} B:{problem.layout_b}: the kernel reads A "
                                  "(M, K) and B (N, K) K-contiguous (A:row B:col), as nn.Linear stores them")
        if "K" in problem.dynamic:
            return Support(False, "K is dynamic: the K tail is not masked, K must be a static multiple of BLOCK_K")
        if problem.K % limits.MFMA_K:
            return Support(False, f"K={problem.K} is not a multiple of {limits.MFMA_K} (the K tail is not masked)")
        for inp in problem.epilogue_inputs:
            if inp.broadcast not in ("", "M", "N", "MN"):
                return Support(False, f"epilogue input pattern {inp.broadcast!r} (takes '', M, N, MN)")
            if inp.dtype not in INPUT_DTYPES:
                return Support(False, f"epilogue input dtype {inp.dtype}")
        if max(problem.M * problem.K, problem.N * problem.K, problem.M * problem.N) * 4 > INT32_MAX:
            return Support(False, "an operand over 2 GiB (buffer descriptors take 32-bit byte offsets)")
        try:
            self.epilogue_code(problem)
        except (UnsupportedProblemError, ValueError, KeyError) as e:
            return Support(False, f"epilogue not expressible in FlyDSL: {e}")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if problem.K % params["BLOCK_K"]:
            return f"K={problem.K} is not a multiple of BLOCK_K={params['BLOCK_K']} (the K tail is not masked)"
        return limits.tile_refusal(params, ELEMENT_BYTES[problem.dtype])

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        """Tiles that suit gfx950's 256 CUs: 128x128 (4 waves, 2 stages) and its interleaved
        and 3-stage twins for large C, 256x128 over 8 waves, 64x64 and 32-row tiles for small or
        decode-shaped C; each clamped to the problem (no tile side beyond the next power of two
        of M or N, 32 at least), illegal ones (K, LDS, VGPRs, copy coverage) dropped."""
        def clamp(v: int, n: int) -> int:
            return min(v, max(32, 1 << max(n - 1, 0).bit_length()))
        seeds = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=2),
                 dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3, INTERLEAVE=True),
                 dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=2),
                 dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
                 dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, num_warps=4, num_stages=4),
                 dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
                 dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=2)]
        out = []
        for s in seeds:
            s = {**s, "BLOCK_M": clamp(s["BLOCK_M"], problem.M), "BLOCK_N": clamp(s["BLOCK_N"], problem.N)}
            p = self.space.complete({**s, "GROUP_M": 8 if s["BLOCK_M"] >= 64 else 4})
            if p not in out and self.check(p, problem, target) is None:
                out.append(p)
        return out

    # -- rendering ---------------------------------------------------------------------------
    def epilogue_code(self, problem: Any, *, row: str = "m", col: str = "n", group: str = "b"
                      ) -> tuple[list[str], str, str]:
        """The epilogue as FlyDSL statements over ``acc`` (the fp32 accumulator of element
        (m, n)): (lines, the output value's code in the output dtype, module-level helpers).
        Input k is read from the flattened ``E<k>`` at ``row * se<k>_m + col * se<k>_n``
        (plus ``group * se<k>_b`` for per-group inputs).

        Raises:
            UnsupportedProblemError: an IR op or dtype the FlyDSL emitter refuses
                (:func:`tilewright.templates.flydsl.emit.unsupported_op`: sin, cos, ... have no
                gfx950 lowering without ROCm's device library).
        """
        from tilewright.ir.epilogue import problem_epilogue
        from tilewright.templates.flydsl.emit import FlyExpr

        def load(n) -> str:
            k = int(n.arg[0][1:])
            pattern = problem.epilogue_inputs[k].broadcast
            terms = [f"{v} * se{k}_{d.lower()}" for d, v in (("B", group), ("M", row), ("N", col))
                     if d in pattern]
            index = " + ".join(terms) if terms else "0"
            return e.load_value(f"fx.memref_load(E{k}, {index})", problem.epilogue_inputs[k].dtype)

        e = FlyExpr(load=load, acc=lambda n: "acc", prefix="ep")
        value = e.emit(problem_epilogue(problem))
        out_value = e.store_value(value, "fp32", problem.out_dtype)
        return list(e.lines), out_value, e.helpers()

    def context(self, problem: Any, params: Params, target: Target) -> dict[str, Any]:
        lines, out_value, helpers = self.epilogue_code(problem)
        wm, wn = limits.wave_grid(params["num_warps"])
        ab_fx, ab_torch = AB_DTYPES[problem.dtype]
        return dict(
            problem_text=problem.describe(), params_text=self.space.encode(params), target=target.name,
            kernel_name=self.kernel_name, ab_fx=ab_fx, ab_torch=ab_torch,
            out_torch=OUT_DTYPES[problem.out_dtype], THREADS=params["num_warps"] * limits.WAVE,
            WM=wm, WN=wn, epilogue_lines=lines, out_value=out_value, helpers=helpers,
            inputs=self.input_context(problem), **params)

    def input_context(self, problem: Any) -> list[dict[str, Any]]:
        """Placeholder shapes and strides for compile_aot (strides 0 where an input broadcasts)."""
        M, N = self.aot_sizes(problem)[:2]
        out = []
        for k, inp in enumerate(problem.epilogue_inputs):
            sm = N if inp.broadcast == "MN" else 1 if inp.broadcast == "M" else 0
            sn = 1 if "N" in inp.broadcast else 0
            numel = {"": 1, "M": M, "N": N, "MN": M * N}[inp.broadcast]
            natural = {"": "()", "M": f"({M}, 1)", "N": f"({N},)", "MN": f"({M}, {N})"}[inp.broadcast]
            out.append(dict(index=k, numel=numel, sm=sm, sn=sn, torch=OUT_DTYPES[inp.dtype], natural=natural))
        return out

    @staticmethod
    def aot_sizes(problem: Any) -> tuple[int, int, int]:
        """Sizes the placeholders are made with: the problem's, capped (any will do, sizes are
        run-time values; the cap keeps a large model's placeholders small)."""
        return (min(max(problem.M, 1), PLACEHOLDER_MAX), min(max(problem.N, 1), PLACEHOLDER_MAX),
                min(max(problem.K, limits.MFMA_K), PLACEHOLDER_MAX))

    def render_kernel(self, problem: Any, params: Params, target: Target) -> RenderedKernel:
        M, N, K = self.aot_sizes(problem)
        source = self.render_jinja(aot_M=M, aot_N=N, aot_K=K, **self.context(problem, params, target))
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name=self.kernel_name, language="flydsl",
            meta={"kind": self.op, "language": "flydsl",
                  "lds_bytes": limits.lds_bytes(params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"],
                                                params["num_stages"], ELEMENT_BYTES[problem.dtype])},
            aot=AotSpec(self.kernel_name, "flydsl", {}, {}, (), {"gpu_arch": target.arch}))

    # -- promises ----------------------------------------------------------------------------
    def expected_instructions(self, problem: Any, params: Params, target: Target) -> list[InstructionCheck]:
        if target.arch != limits.ARCH:
            return []
        return [mfma_check(problem.dtype)]

"""FlyDSL MXFP4 / MXFP8 block-scaled GEMM for gfx950 (CDNA4) on the scaled MFMA
``v_mfma_scale_f32_16x16x128_f8f6f4`` (template ``flydsl.mx_gemm``); the module's ``launch`` runs
it on the current stream (:mod:`tilewright.templates.flydsl.launch`), compile-checked only here.

Formats (OCP Microscaling Formats (MX) v1.0): mxfp4 = E2M1 values packed two per byte (even
index in the low nibble) + one E8M0 scale per 32 values along K; mxfp8 = E4M3 values + one E8M0
scale per 32. A is (M, K) and B is stored (N, K) (``layout_b == "col"``), both K-contiguous;
scales are row-major (rows, K/32) bytes (``scale_layout == "row"``).

The kernel (``mx_gemm.py.jinja``), per workgroup of ``num_warps`` waves and a BLOCK_M x BLOCK_N
output tile:

- K loop in BLOCK_K steps; A and B tiles go global -> registers (16-byte buffer loads, rows past
  M/N read as zeros through the buffer descriptor's bound) -> LDS, in ``num_stages`` ring
  buffers, so the loads for step t + num_stages - 1 are in flight while step t computes;
- each wave owns (BLOCK_M / WARPS_M) x (BLOCK_N / WARPS_N) outputs as 16x16 MFMA tiles; per
  128-wide K sub-step a lane reads its 32 K values of one A row and one B column from LDS, and
  its E8M0 scale byte for that 32-value block straight from global memory;
- fp32 accumulation; the fused epilogue (:func:`tilewright.ir.epilogue.problem_epilogue`: the
  per-tensor global scales as multiplies by 0-dim inputs, bias, activations, any pointwise
  chain the FlyDSL emitter :mod:`.emit` renders) runs per element on the accumulator, then
  the value is stored in the output dtype with row/column masks.

MFMA operand and result layout (AMD CDNA4 ISA, "dense matrix layouts" of V_MFMA_SCALE_F32_
16X16X128_F8F6F4): lane l holds row (or column) l % 16 and K values 32*(l // 16) ... +31 (16
bytes of fp4 or 32 of fp8), with one scale byte (op_sel 0) for exactly that 32-value block;
result register r of lane l is D[4 * (l // 16) + r][l % 16]. :mod:`.mx_emulate` replays this
index and scale math in torch against a float64 reference.

Epilogue inputs are read through buffer descriptors (out-of-range reads give 0), so masked
lanes need no clamping; only the stores are masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilewright.errors import UnsupportedProblemError
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES, SCALED_FORMATS
from tilewright.templates.flydsl import runtime as fly_runtime
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support,
    TemplateSpec,
)
from tilewright.templates.flydsl.gemm import LaunchedWhereInstalled

# format -> (values per byte, MFMA cbsz/blgp format code: 0 = FP8 E4M3, 4 = FP4 E2M1)
FORMATS = {"mxfp4": (2, 4), "mxfp8": (1, 0)}
OUT_TYPES = {"bf16": ("fx.BFloat16", 2), "fp16": ("fx.Float16", 2), "fp32": ("fx.Float32", 4)}
# waves per workgroup -> (WARPS_M, WARPS_N)
WARP_GRID = {4: (2, 2), 8: (4, 2)}
MFMA_K = 128          # K values one scaled MFMA consumes
LDS_ROW_PAD = 16      # bytes added to each LDS row: spreads the 16-row MFMA reads over banks
VGPR_LIMIT = 256      # FlyDSL 0.5.0 allocates no AGPRs, so accumulators share the 256 VGPRs
INT32_MAX = 2**31 - 1
KERNEL = "mx_gemm_kernel"


@dataclass(frozen=True)
class Geometry:
    """Every size the kernel text and :mod:`.mx_emulate` derive from (fmt, params).

    Units: ``*_B`` fields are bytes; ``a_loads``/``b_loads`` are 16-byte loads per thread per
    K tile; ``tm``/``tn`` are 16x16 MFMA tiles per wave along M/N.
    """

    fmt: str
    BM: int
    BN: int
    BK: int
    GROUP_M: int
    num_warps: int
    stages: int

    @property
    def vpb(self) -> int:
        return FORMATS[self.fmt][0]

    @property
    def fmt_code(self) -> int:
        return FORMATS[self.fmt][1]

    @property
    def warps(self) -> tuple[int, int]:
        return WARP_GRID[self.num_warps]

    @property
    def threads(self) -> int:
        return 64 * self.num_warps

    @property
    def row_B(self) -> int:  # bytes of one row of a K tile
        return self.BK // self.vpb

    @property
    def step_B(self) -> int:  # bytes of one row per 128-wide MFMA step
        return MFMA_K // self.vpb

    @property
    def lane_B(self) -> int:  # bytes one lane feeds one MFMA operand (16 fp4 / 32 fp8)
        return self.step_B // 4

    @property
    def lds_row_B(self) -> int:
        return self.row_B + LDS_ROW_PAD

    @property
    def a_buf_B(self) -> int:
        return self.BM * self.lds_row_B

    @property
    def stage_B(self) -> int:
        return (self.BM + self.BN) * self.lds_row_B

    @property
    def lds_B(self) -> int:
        """LDS the kernel allocates: ``stages * (BM + BN) * (BK / values-per-byte + 16)``."""
        return self.stages * self.stage_B

    @property
    def chunks_per_row(self) -> int:
        return self.row_B // 16

    @property
    def a_loads(self) -> int:
        return self.BM * self.chunks_per_row // self.threads

    @property
    def b_loads(self) -> int:
        return self.BN * self.chunks_per_row // self.threads

    @property
    def ksteps(self) -> int:
        return self.BK // MFMA_K

    @property
    def tm(self) -> int:
        return self.BM // self.warps[0] // 16

    @property
    def tn(self) -> int:
        return self.BN // self.warps[1] // 16

    def vgpr_estimate(self) -> int:
        """Live VGPRs per lane: accumulators (4 per MFMA tile), the operands and scales of up
        to two 128-wide K steps (LLVM reads the next step's operands during this step's MFMAs),
        the prefetched tile (4 per 16-byte load) and ~24 for addresses and indices.

        Measured (FlyDSL 0.5.0, gfx950; estimate / compiled ``.vgpr_count``): mxfp4 64x64x256 w4
        96/106, 128x128x256 w4 200/170, 256x128x256 w8 192/208; mxfp8 64x64x128 w4 92/92,
        128x128x256 w4 296/252 (refused, though it compiled without spills). The instruction
        check's no-scratch rule catches a tile the estimate lets through that spills."""
        acc = 4 * self.tm * self.tn
        operands = min(self.ksteps, 2) * (self.tm + self.tn) * (self.lane_B // 4 + 1)
        prefetch = 4 * (self.a_loads + self.b_loads)
        return acc + operands + prefetch + 24

    def refusal(self) -> str | None:
        """Why this tiling cannot be built (None when it can)."""
        wm, wn = self.warps
        if self.BK % MFMA_K:
            return f"BLOCK_K={self.BK} is not a multiple of the scaled MFMA's K ({MFMA_K})"
        if self.BM % (16 * wm) or self.BN % (16 * wn):
            return (f"a {self.BM}x{self.BN} tile does not split into {wm}x{wn} waves of 16x16 MFMA "
                    f"tiles (num_warps={self.num_warps})")
        for name, rows in (("A", self.BM), ("B", self.BN)):
            if (rows * self.chunks_per_row) % self.threads:
                return (f"the {name} tile ({rows} rows x {self.row_B} B) is not a whole number of "
                        f"16-byte loads per thread for {self.threads} threads")
        if self.lds_B > fly_runtime.LDS_LIMIT["gfx950"]:
            return f"needs {self.lds_B} B of LDS, gfx950 has {fly_runtime.LDS_LIMIT['gfx950']} (160 KiB)"
        if (v := self.vgpr_estimate()) > VGPR_LIMIT:
            return f"needs about {v} VGPRs per lane, more than {VGPR_LIMIT} (FlyDSL 0.5.0 uses no AGPRs)"
        return None


def geometry(problem: GemmProblem, params: Params) -> Geometry:
    """The :class:`Geometry` of ``problem`` (its MX format) with complete ``params``."""
    return Geometry(problem.dtype, params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"],
                    params["GROUP_M"], params["num_warps"], params["num_stages"])


def epilogue_code(problem: GemmProblem) -> tuple[list[str], str, str]:
    """The fused epilogue through the FlyDSL IR emitter (:mod:`.emit`): (statements over
    ``acc``, the fp32 accumulator of output element (m, n); the stored value's code in the
    output dtype; module-level helpers). Input k is read from the flattened buffer tensor
    ``E<k>`` at ``m * se<k>_m + n * se<k>_n`` (strides 0 where it broadcasts).

    Raises:
        UnsupportedProblemError: an op or dtype the emitter refuses (sin, cos, fp8, ...).
    """
    from tilewright.ir.epilogue import problem_epilogue
    from tilewright.templates.flydsl.emit import FlyExpr

    def load(n) -> str:
        k = int(n.arg[0][1:])
        inp = problem.epilogue_inputs[k]
        index = " + ".join(f"{d} * se{k}_{d}" for d in "mn" if d.upper() in inp.broadcast) or "0"
        return e.load_value(f"fx.memref_load(E{k}, {index})", inp.dtype)

    e = FlyExpr(load=load, acc=lambda n: "acc", prefix="ep")
    value = e.emit(problem_epilogue(problem))
    return list(e.lines), e.store_value(value, "fp32", problem.out_dtype), e.helpers()


def input_context(problem: GemmProblem) -> list[dict[str, Any]]:
    """Per epilogue input: compile_aot placeholder size and strides (m, n), 0 where it broadcasts."""
    M, N = max(problem.M, 1), max(problem.N, 1)
    out = []
    for k, inp in enumerate(problem.epilogue_inputs):
        out.append(dict(index=k, numel={"": 1, "M": M, "N": N, "MN": M * N}[inp.broadcast],
                        sm=N if inp.broadcast == "MN" else 1 if inp.broadcast == "M" else 0,
                        sn=1 if "N" in inp.broadcast else 0,
                        natural={"": "()", "M": f"({M}, 1)", "N": f"({N},)", "MN": f"({M}, {N})"}[inp.broadcast],
                        torch={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[inp.dtype]))
    return out


class FlyDslMxGemm(LaunchedWhereInstalled, TemplateSpec):

    id = "flydsl.mx_gemm"
    backend = "flydsl"
    op = "gemm"
    jinja = "mx_gemm.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (32, 64, 128, 256), 128, "output rows per workgroup"),
        Knob("BLOCK_N", (32, 64, 128, 256), 128, "output columns per workgroup"),
        Knob("BLOCK_K", (128, 256, 512), 256, "K values per LDS stage (multiple of the MFMA's 128)"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "tile rows per swizzle group"),
        Knob("num_warps", (4, 8), 4, "waves per workgroup (2x2 or 4x2 over the tile)"),
        Knob("num_stages", (2, 3, 4), 2, "LDS ring buffers (tiles in flight + 1)"),
    ))

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        """Whether the problem can be built for ``target`` (the toolchain is the language's
        check): gfx950, mxfp4/mxfp8 with K-major operands and row-major scales, static K a
        multiple of 128, 32-bit offsets, and an epilogue the FlyDSL emitter renders."""
        if target.arch != "gfx950":
            return Support(False, f"{self.id} is written for gfx950's scaled MFMA, not {target.name}")
        if problem.dtype not in FORMATS:
            return Support(False, f"input dtype {problem.dtype} (takes {', '.join(FORMATS)})")
        if problem.scale_layout != "row":
            return Support(False, f"scale layout {problem.scale_layout!r} (takes row-major 'row' scales)")
        if (problem.layout_a, problem.layout_b) != ("row", "col"):
            return Support(False, "block-scaled operands must be K-major: A (M, K) and B stored (N, K)")
        if problem.out_dtype not in OUT_TYPES:
            return Support(False, f"output dtype {problem.out_dtype} (takes {', '.join(OUT_TYPES)})")
        if problem.batched or problem.batch != 1:
            return Support(False, "batched GEMMs are not implemented here")
        if problem.store_acc:
            return Support(False, f"{self.id} does not store the product beside its epilogue")
        if "K" in problem.dynamic:
            return Support(False, "K must be static: the K loop needs K a multiple of BLOCK_K")
        if problem.K == 0 or problem.K % MFMA_K:
            return Support(False, f"K={problem.K} is not a positive multiple of {MFMA_K} (the scaled "
                                  f"MFMA's K; scales come per {SCALED_FORMATS[problem.dtype]})")
        for inp in problem.epilogue_inputs:
            if inp.broadcast not in ("", "M", "N", "MN"):
                return Support(False, f"epilogue input pattern {inp.broadcast!r} (takes '', M, N, MN)")
            if inp.dtype not in OUT_TYPES:
                return Support(False, f"epilogue input dtype {inp.dtype} (takes {', '.join(OUT_TYPES)})")
        try:
            epilogue_code(problem)
        except (UnsupportedProblemError, ValueError, KeyError) as e:
            return Support(False, f"epilogue not expressible in FlyDSL: {e}")
        vb = ELEMENT_BYTES[problem.out_dtype]
        if max(problem.M, problem.N) * problem.K // FORMATS[problem.dtype][0] > INT32_MAX // 2 or \
                problem.M * problem.N * vb > INT32_MAX // 2:
            return Support(False, "an operand or the output exceeds 2**30 bytes (32-bit buffer offsets)")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        """Why ``params`` cannot be built for the problem (None when legal): outside the space,
        K not a multiple of 32 or of BLOCK_K, LDS over 160 KiB, VGPRs over 256, a tile the waves
        or loads do not divide."""
        if (why := self.space_refusal(params)) is not None:
            return why
        params = self.space.complete(params)
        if problem.scale_layout != "row":
            return f"scale layout {problem.scale_layout!r} is not supported (row-major scales only)"
        if problem.K % SCALED_FORMATS.get(problem.dtype, 32):
            return f"K={problem.K} is not a multiple of the 32-value scale block"
        if problem.K % params["BLOCK_K"]:
            return f"K={problem.K} is not a multiple of BLOCK_K={params['BLOCK_K']}"
        if problem.dtype not in FORMATS:
            return f"input dtype {problem.dtype}"
        return geometry(problem, params).refusal()

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        """Candidate tiles, largest first, the legal ones only."""
        out = []
        for bm, bn, warps in ((128, 128, 4), (256, 128, 8), (128, 64, 4), (64, 64, 4)):
            for bk in (256, 128):
                for stages in (3, 2):
                    p = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                         "num_warps": warps, "num_stages": stages}
                    if self.check(p, problem, target) is None:
                        out.append(p)
                        break
        return out

    def context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        g = geometry(problem, params)
        lines, out_value, helpers = epilogue_code(problem)
        return dict(g=g, problem_text=problem.describe(), params_text=self.space.encode(params),
                    epilogue_lines=lines, out_value=out_value, helpers=helpers,
                    inputs=input_context(problem), out_bytes=OUT_TYPES[problem.out_dtype][1],
                    out_torch={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[problem.out_dtype],
                    M=problem.M, N=problem.N, K=problem.K, kernel=KERNEL)

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        """The FlyDSL module (kernel, ``@flyc.jit`` host ``mx_gemm``, the torch-facing ``launch``
        and ``compile_aot()``).

        Raises:
            UnsupportedProblemError: an epilogue the FlyDSL emitter refuses.
        """
        source = self.render_jinja(**self.context(problem, params))
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name=self.id.replace(".", "_"), language="flydsl",
            meta={"kind": self.op, "language": "flydsl", "lds_bytes": geometry(problem, params).lds_B},
            aot=AotSpec(kernel=KERNEL, language="flydsl", pointer_types={}, constexprs={},
                        divisible_by_16=(), options={"gpu_arch": target.arch}))

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        """The scaled MFMA in the FP4 or FP8 operand format, LDS traffic, no scratch (spills)."""
        if target.arch != "gfx950":
            return []
        code = FORMATS[problem.dtype][1]
        mfma = r"v_mfma_scale_f32_16x16x128_f8f6f4" + (rf"[^\n]*cbsz:{code}[^\n]*blgp:{code}" if code else "")
        forbid = (r"scratch_", r"buffer_store_dword\S* [^\n]*off, s\[0:3\]")
        checks = [InstructionCheck("amdgcn", (mfma, r"ds_read_b128", r"ds_write_b128"), forbid,
                                   f"{problem.dtype} scaled MFMAs fed from LDS, no spills")]
        if code == 0:  # fp8: no FP4 format bits may appear
            checks.append(InstructionCheck("amdgcn", (), (r"v_mfma_scale\S*[^\n]*cbsz:4",),
                                           "FP8 (E4M3) operands"))
        return checks

    def efficiency(self, target: Target) -> float:
        return 0.9  # simple synchronous LDS pipeline, scales from global: an estimate, unmeasured

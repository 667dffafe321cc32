"""CuTeDSL block-scaled GEMM for sm_100a: NVFP4 (E2M1 values, E4M3 scale per 16), MXFP4 (E2M1,
E8M0 scale per 32) and MXFP8 (E4M3, E8M0 per 32) through tcgen05's block-scaled MMA
(``tcgen05.mma ... block_scale``), with the per-tensor global scales (alpha) and the rest of the
epilogue fused.

Operands come as stored: A (M, K) and B (N, K), K-major, values packed along K; the scales in
the 128x4 tiled layout tcgen05 reads (``tilewright.quant.nvfp4.swizzle_scales``; a problem with
``scale_layout == "row"`` gets them swizzled in the launcher). Formats: NVIDIA's NVFP4 and the
OCP Microscaling Formats (MX) v1.0 specification; the scale layout is the PTX ISA's
"tcgen05 block scaling" layout (also cuBLAS's 1D block-scaling layout).

Decode shapes (a few tokens against a large weight) get two remedies, as the Triton NVFP4
templates do (``kinds/gemm/decode.py`` proposes them):

* **SWAP_AB** computes D^T = B A^T: both operands are K-major rows of packed values with their
  scales along K, so they (and their scales) simply trade places; the weight's N fills the MMA's
  128 rows and the tokens take a 32-256-column tile. The epilogue writes through a transposed
  view of the user's (M, N) output and reads its inputs transposed (a bias along N becomes a
  per-row vector of the kernel).
* **SPLIT_K** gives each of SPLIT_K work items of one output tile an even share of the K tiles;
  each stores its fp32 partial into a workspace (SPLIT_K, M, N), and a reduce kernel in the same
  module adds them in a fixed order (deterministic) and runs the fused epilogue.

Tiles of 32 or 64 columns read their scale factors from the 128-row scale atom that holds them
(the layout pads SFB to 128 rows), starting ``(tile % (128 / BLOCK_N)) * BLOCK_N / 32`` TMEM
words in, as CUTLASS's dense_blockscaled_gemm_persistent.py does for 64-column tiles
(:func:`sfb_atom`). 16-column tiles would start mid-word and are not offered.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import SCALED_FORMATS
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Knob, ParamSpace, Params, Support, SUPPORTED
from tilewright.templates.cutedsl.common import PDL_KNOB, SMEM_BUDGET, CuteDslGemm, pdl_variants, useful_stages

# format -> (value type, values per byte, scale type, torch scale dtype)
FORMATS = {
    "nvfp4": ("cutlass.Float4E2M1FN", 2, "cutlass.Float8E4M3FN", "float8_e4m3fn"),
    "mxfp4": ("cutlass.Float4E2M1FN", 2, "cutlass.Float8E8M0FNU", "float8_e8m0fnu"),
    "mxfp8": ("cutlass.Float8E4M3FN", 1, "cutlass.Float8E8M0FNU", "float8_e8m0fnu"),
}
# what each format's MMA is called in PTX (measured with nvidia-cutlass-dsl 4.8.1)
MMA_KIND = {"nvfp4": r"kind::mxf4nvf4\.block_scale\.block16",
            "mxfp4": r"kind::mxf4nvf4\.block_scale\.block32",
            "mxfp8": r"kind::mxf8f6f4\.block_scale\.block32"}
TMEM_COLUMNS = 512


def value_bytes(fmt: str) -> float:
    return 1 / FORMATS[fmt][1]


class CuteBlockScaledSm100(CuteDslGemm):
    id = "cutedsl.blockscaled_sm100"
    arch = "sm_100a"
    jinja = "blockscaled_sm100.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", (128,), 128, "output rows per CTA (block-scaled MMAs are 128 rows per CTA)"),
        Knob("BLOCK_N", (32, 64, 128, 256), 128, "output columns per CTA (the MMA's N)"),
        Knob("BLOCK_K", (128, 256), 256, "K values per pipeline stage: 128 bytes (256 fp4, 128 fp8)"),
        Knob("CTA_GROUP", (1, 2), 1, "CTAs per MMA: 2 runs cta_group::2 MMAs on a cluster pair"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "tile rows per swizzle group of the tile scheduler"),
        Knob("num_warps", (6,), 6, "warps per CTA: 4 epilogue, 1 MMA, 1 TMA (fixed)"),
        Knob("num_stages", (2, 3, 4, 5, 6, 7, 8), 4, "depth of the shared-memory operand ring"),
        Knob("SWAP_AB", (False, True), False, "compute D^T = B A^T: the weight's N fills the MMA's 128 rows"),
        Knob("SPLIT_K", (1, 2, 4, 8, 16), 1, "work items sharing one output tile's K tiles (fp32 workspace + reduce)"),
        PDL_KNOB,
    ))

    def dtype_support(self, problem: GemmProblem) -> Support:
        if problem.dtype not in FORMATS:
            return Support(False, f"input dtype {problem.dtype} (takes block-scaled {', '.join(FORMATS)})")
        if (problem.layout_a, problem.layout_b) != ("row", "col"):
            return Support(False, "block-scaled operands must be K-major: A (M, K) and B stored (N, K)")
        if problem.K == 0 and "K" not in problem.dynamic:
            return Support(False, "K == 0 (nothing to multiply; ATen fills the epilogue)")
        return SUPPORTED

    def tile_refusal(self, params: Params, problem: GemmProblem) -> str | None:
        vb = value_bytes(problem.dtype)
        params = {"SWAP_AB": False, "SPLIT_K": 1, **params}
        if params["BLOCK_K"] * vb != 128:
            return f"BLOCK_K must span 128 bytes of K ({int(128 / vb)} values for {problem.dtype})"
        if params["CTA_GROUP"] == 2 and params["BLOCK_N"] < 128:
            return (f"BLOCK_N={params['BLOCK_N']} with CTA_GROUP=2: 2-CTA MMAs multicast whole "
                    "128-row scale atoms of B here (take CTA_GROUP=1)")
        split = params["SPLIT_K"]
        if split > 1:
            if params["CTA_GROUP"] == 2:
                return "SPLIT_K > 1 runs 1-CTA MMAs only here (take CTA_GROUP=1)"
            if "K" not in problem.dynamic and -(-problem.K // params["BLOCK_K"]) < split:
                return (f"K={problem.K} is too short to split {split} ways of BLOCK_K={params['BLOCK_K']} "
                        f"(each split needs at least one K tile; take SPLIT_K <= "
                        f"{max(1, -(-problem.K // params['BLOCK_K']))})")
        sf_bytes = (params["BLOCK_M"] + max(params["BLOCK_N"], 128)) * params["BLOCK_K"] \
            // SCALED_FORMATS[problem.dtype]
        per_stage = (params["BLOCK_M"] + params["BLOCK_N"] // params["CTA_GROUP"]) * params["BLOCK_K"] * vb \
            + sf_bytes
        if per_stage * params["num_stages"] > SMEM_BUDGET:
            return f"the operand ring needs {int(per_stage * params['num_stages'])} B of shared memory (> {SMEM_BUDGET})"
        return None

    def acc_stages(self, params: Params) -> int:
        """Accumulators in TMEM: two (epilogue overlapping the next mainloop) when they fit next
        to one stage of scale factors (4 columns per 32 rows of A and of B), else one."""
        sf_columns = (params["BLOCK_M"] // 32) * 4 + (max(params["BLOCK_N"], 128) // 32) * 4
        return 2 if 2 * params["BLOCK_N"] + sf_columns <= TMEM_COLUMNS else 1

    def seed_tiles(self, problem: GemmProblem, target: Target | None = None) -> list[dict[str, Any]]:
        """The 1- and 2-CTA tiles; with a ``target``, for decode shapes (M <= 128 on sm_100a)
        first the bounded swap-AB / split-K list of :func:`decode_tiles`."""
        bk = int(128 / value_bytes(problem.dtype))
        shapes = [(256, 2), (128, 2), (256, 1), (128, 1)]
        if problem.M <= 128:
            # decode: one CTA per MMA keeps the most tiles in flight across the SMs
            shapes = [(128, 1), (256, 1), (128, 2)]
        tiles = [{"BLOCK_N": bn, "CTA_GROUP": group, "SWAP_AB": False, "SPLIT_K": 1} for bn, group in shapes]
        if target is not None:
            tiles = decode_tiles(problem, target, set(self.space.names())) + tiles
        out = []
        for tile in tiles:
            params = {"BLOCK_M": 128, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": 6,
                      "num_stages": useful_stages(problem, bk, 8), **tile}
            while params["num_stages"] > 2 and self.tile_refusal(params, problem):
                params["num_stages"] -= 1  # the deepest ring that fits
            if params not in out:
                out.append(params)
        return out

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        out = []
        for tile in self.seed_tiles(problem, target):
            for pdl in pdl_variants():
                params = {**tile, "PDL": pdl}
                if params not in out and self.check(params, problem, target) is None:
                    out.append(params)
        return out

    def kernel_problem(self, problem: GemmProblem, params: Params) -> GemmProblem:
        """What the kernel computes: the transposed problem under SWAP_AB."""
        return problem.transposed() if params.get("SWAP_AB") else problem

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        # the epilogue inputs broadcast over the kernel's dims (a bias along N is per-row
        # when swapped); the header still names the user's problem
        ctx = super().context(self.kernel_problem(problem, params), params, target)
        ctx["problem_text"] = problem.describe()
        return ctx

    def extra_context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        ab, pack, sf, sf_torch = FORMATS[problem.dtype]
        value_torch = "(torch.uint8, torch.float4_e2m1fn_x2)" if pack == 2 else "(torch.float8_e4m3fn,)"
        return dict(fmt=problem.dtype, ab_cute=ab, pack=pack, sf_cute=sf, sf_torch=sf_torch,
                    value_torch=value_torch,
                    sf_vec=SCALED_FORMATS[problem.dtype], scale_layout=problem.scale_layout,
                    acc_stages=self.acc_stages(params))

    def mma_checks(self, problem: GemmProblem, params: Params) -> list[InstructionCheck]:
        group = params["CTA_GROUP"]
        kind = MMA_KIND[problem.dtype]
        return [InstructionCheck("ptx", (rf"tcgen05\.mma\.cta_group::{group}\.{kind}",), (r"wgmma",),
                                 f"{group}-CTA block-scaled tcgen05 MMAs ({problem.dtype})"),
                InstructionCheck("ptx", (r"tcgen05\.cp",), (), "scale factors copied to tensor memory")]

    def efficiency(self, target: Target) -> float:
        return 1.25  # as cutedsl.gemm_sm100: an estimate until measured on a B200


def sfb_atom(tile_n: int, block_n: int) -> tuple[int, int]:
    """Where output-column tile ``tile_n`` of width ``block_n`` finds its B scale factors:
    (index of the SFB tile TMA loads, of max(block_n, 128) rows; TMEM words into it the MMA
    starts at). The scale layout holds 32 rows per TMEM word (4 words per 128-row atom), so a
    64-column tile starts 0 or 2 words into its atom and a 32-column one 0..3; 128/256-column
    tiles own whole atoms. The kernel computes the same two numbers (blockscaled_sm100.py.jinja:
    SFB_TILES_PER_ATOM, SFB_WORDS)."""
    if block_n >= 128:
        return tile_n, 0
    per_atom = 128 // block_n
    return tile_n // per_atom, (tile_n % per_atom) * (block_n // 32)


def k_tiles_of(split: int, num_k_tiles: int, splits: int) -> tuple[int, int]:
    """The K tiles [begin, end) split ``split`` of ``splits`` accumulates: an even share
    (never empty while num_k_tiles >= splits, which ``check`` and the launcher ensure)."""
    return split * num_k_tiles // splits, (split + 1) * num_k_tiles // splits


def decode_tiles(problem: GemmProblem, target: Target, knobs: set[str]) -> list[dict[str, Any]]:
    """The bounded decode list on this template's tiles (the policy of ``kinds/gemm/decode.py``:
    swap-AB when N >= 4 M, split-K to about one wave of SMs when the grid is short and K long):
    per orientation two tile widths, each alone and with its split-K. Swapped, the tokens take
    a 64-256-column tile (M rounded up, and twice that); plain, the weight's N takes 128 or 64
    columns. BLOCK_M is the MMA's 128 rows, 1-CTA MMAs. At most 8 settings; none beyond the
    decode M or without tcgen05."""
    from tilewright.kinds.gemm.decode import decode_limit, split_for, wants_split_k, wants_swap_ab

    if problem.M > decode_limit(problem, target) or not target.has("tcgen05"):
        return []
    # 64 columns at least: CUTLASS's block-scaled kernels allow 64/128/192/256; the 32-column
    # tile's scale offset extends their rule and is proven only in the CPU emulation, so it
    # is not proposed until a GPU check (tests/test_cutedsl_decode.py, gpu) confirms it
    thin = 64
    while thin < min(problem.M, 256):
        thin *= 2
    orientations = [(False, (128, 64))]
    if "SWAP_AB" in knobs and wants_swap_ab(problem, 128):
        orientations.insert(0, (True, (thin, min(2 * thin, 256))))
    out: list[dict[str, Any]] = []
    for swap, widths in orientations:
        kp = problem.transposed() if swap else problem
        for bn in widths:
            tile = {"BLOCK_N": bn, "CTA_GROUP": 1, "SWAP_AB": swap, "SPLIT_K": 1}
            out.append(tile)
            if "SPLIT_K" in knobs and wants_split_k(kp, target, 128, bn):
                out.append({**tile, "SPLIT_K": split_for(kp, target, 128, bn)})
    return out

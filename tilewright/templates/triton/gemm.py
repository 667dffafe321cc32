"""Tiled Triton GEMM with GROUP_M swizzle, any strides, a batch dimension and a fused epilogue.

Parameters are the usual Triton GEMM tunables (BLOCK_M/BLOCK_N/BLOCK_K, GROUP_M, num_warps,
num_stages). Masks make every M/N/K legal (1, primes, 0); accumulation is fp32 for every input
dtype. On the ``cpu`` target the kernel runs in the Triton interpreter, whose bf16 arithmetic is
wrong (triton issue 11584), so bf16 (and fp8) tiles are upcast to fp32 there before ``tl.dot``.
"""

from __future__ import annotations

from typing import Any

from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES
from tilewright.runtime.targets import Target, triton_can_target
from tilewright.ir.epilogue import epilogue_expr, problem_epilogue
from tilewright.templates.triton.epilogue import render_epilogue
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, ParamSpace, Params, RenderedKernel, Support,
    TemplateSpec, powers_of_two,
)
from tilewright.templates.triton import registers
from tilewright.templates.triton.pdl import GDC_IMPORT, PDL_KNOB, pdl_checks, pdl_refusal

TORCH_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
               "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}
TRITON_POINTER = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "fp8e4m3": "*fp8e4nv",
                  "fp8e5m2": "*fp8e5"}
INT32_MAX = 2**31 - 1
# fp32 accumulator registers a thread may hold before the kernel spills (of 255 per thread)
MAX_ACC_REGS_PER_THREAD = 128
FP8 = ("fp8e4m3", "fp8e5m2")


def smem_bytes(problem: GemmProblem, params: Params) -> int:
    """Shared memory the software pipeline holds: num_stages copies of an A and a B tile."""
    tile = params["BLOCK_M"] * params["BLOCK_K"] + params["BLOCK_K"] * params["BLOCK_N"]
    return max(params["num_stages"] - 1, 1) * tile * ELEMENT_BYTES[problem.dtype]


def tensor_core_dtype(problem: GemmProblem, target: Target) -> bool:
    from tilewright._config import config

    return problem.dtype in ("fp16", "bf16") + FP8 or (problem.dtype == "fp32" and config.allow_tf32
                                                         and not target.interpreted)


def needs_int64(problem: GemmProblem) -> bool:
    """64-bit offsets when an operand can exceed 2**31 elements (always, for dynamic sizes)."""
    if problem.dynamic:
        return True
    biggest = max(problem.M * problem.K, problem.K * problem.N, problem.M * problem.N)
    return problem.batch * biggest > INT32_MAX


PTX_DTYPE = {"bf16": "bf16", "fp16": "f16", "fp32": "tf32", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2"}


def epilogue_unit_strides(problem: GemmProblem) -> dict[str, int]:
    """Epilogue inputs that vary along N are contiguous there: their N stride is a constexpr 1."""
    return {f"stride_e{i}n": 1 for i, inp in enumerate(problem.epilogue_inputs)
            if inp.broadcast.endswith("N")}


def divisible_sizes(problem: GemmProblem) -> list[str]:
    """M, N and K when static and a multiple of 16, the hint Triton specializes loads on."""
    return [n for n, v in (("M", problem.M), ("N", problem.N), ("K", problem.K))
            if n not in problem.dynamic and v % 16 == 0]


def compile_options(params: Params) -> dict[str, Any]:
    """triton.compile options of a GEMM kernel (``launch_pdl`` recorded for PDL kernels)."""
    options: dict[str, Any] = {"num_warps": params["num_warps"], "num_stages": params["num_stages"]}
    if params.get("PDL"):
        options["launch_pdl"] = True
    return options


def mma_checks(problem: GemmProblem, params: Params, target: Target) -> list[InstructionCheck]:
    """The matrix instructions a Triton dot of this shape and dtype lowers to on ``target``.

    Measured with triton 3.9: on sm_90a/sm_100a a tile of BLOCK_M >= 64 with >= 4 warps becomes
    wgmma/tcgen05 (fp8: ``kind::f8f6f4``), smaller tiles mma.sync; fp32 without TF32 stays on
    FMA units; fp8 on CDNA4 is ``v_mfma_*_f8f6f4``, on gfx1250 ``v_wmma_*_fp8_fp8``.
    """
    fp8 = problem.dtype in FP8
    if target.backend == "cuda":
        if not tensor_core_dtype(problem, target):
            return [InstructionCheck("ptx", ("fma.rn.f32",), ("wgmma", "tcgen05.mma"),
                                     "fp32 without TF32 runs on FMA units")]
        big = params["BLOCK_M"] >= 64 and params["num_warps"] >= 4
        ptx = PTX_DTYPE[problem.dtype]
        if big and target.has("wgmma"):
            return [InstructionCheck("ptx", (rf"wgmma\.mma_async\S*\.{ptx}",), (), "warpgroup MMA (Hopper)")]
        if big and target.has("tcgen05"):
            kind = r"kind::f8f6f4" if fp8 else r"kind::(f16|tf32)"
            return [InstructionCheck("ptx", (rf"tcgen05\.mma\S*{kind}",), (r"wgmma",), "5th-gen tensor cores")]
        if fp8 and (target.has("wgmma") or target.has("tcgen05")):
            # measured (triton 3.9, sm_90a/sm_100a/sm_103a/sm_110a): a small fp8 tile is
            # converted to f16 (cvt.rn.f16x2.e4m3x2) for mma.sync; sm_89 and sm_12x keep e4m3
            return [InstructionCheck("ptx", (r"mma\.sync\S*\.f16", r"cvt\.rn\.f16x2\.e4m3x2"),
                                     (r"wgmma", r"tcgen05\.mma"), "warp-level MMA on fp8 converted to f16")]
        return [InstructionCheck("ptx", (rf"mma\.sync\S*\.{ptx}",), (r"wgmma", r"tcgen05\.mma"),
                                 "warp-level MMA")]
    if target.backend == "hip":
        suffix = r"\w*(f8|fp8)" if fp8 else ""
        if target.has("wmma"):
            return [InstructionCheck("amdgcn", (rf"v_wmma{suffix}",), (), "WMMA (gfx12)")]
        if target.has("mfma"):
            return [InstructionCheck("amdgcn", (rf"v_mfma{suffix}",), (), "MFMA (CDNA)")]
    return []


CORE_KNOBS = (
    Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of C per program"),
    Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns of C per program"),
    Knob("BLOCK_K", powers_of_two(16, 256), 32, "K slice per main-loop step"),
    Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
    Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
    Knob("num_stages", (1, 2, 3, 4, 5, 6), 3, "software-pipeline depth"),
)


class TritonGemm(TemplateSpec):
    """The general template. Beyond the tile knobs: SPLIT_K > 1 splits K over that many
    programs per tile, writing fp32 partials that a second kernel adds up (in a fixed order)
    before the epilogue; SWAP_AB computes C^T = B^T A^T so a decode GEMM's large N fills the
    MMA's M side (BLOCK_M/BLOCK_N then tile the swapped problem)."""

    id = "triton.gemm"
    backend = "triton"
    op = "gemm"
    stores_acc = True
    jinja = "gemm.py.jinja"
    # the epilogue is rendered through these (part of the source hash)
    kernel_name = "tw_gemm_kernel"
    space = ParamSpace(CORE_KNOBS + (
        Knob("SPLIT_K", (1, 2, 4, 8, 16), 1, "programs sharing one tile's K range"),
        Knob("SWAP_AB", (False, True), False, "compute C^T = B^T A^T"),
        PDL_KNOB,
    ))

    @staticmethod
    def kernel_problem(problem: GemmProblem, params: Params) -> GemmProblem:
        """The problem the kernel itself computes (transposed under SWAP_AB)."""
        return problem.transposed() if params.get("SWAP_AB") else problem

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        if problem.store_acc and not self.stores_acc:
            return Support(False, f"{self.id} does not store the product beside its epilogue")
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if (why := triton_can_target(target)) is not None:
            return Support(False, why)
        if problem.dtype not in ("fp32", "fp16", "bf16") + FP8:
            return Support(False, f"input dtype {problem.dtype} (Triton GEMM takes fp32/fp16/bf16/fp8)")
        if problem.dtype in FP8 and target.backend != "cpu" and not target.has("fp8_e4m3"):
            return Support(False, f"{target.name} has no OCP fp8 (e4m3fn/e5m2) MMA")
        if problem.dtype in FP8 and (why := triton_can_target(target, "fp8_e4m3")) is not None:
            return Support(False, why)
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        if problem.batch > 65535:
            return Support(False, "batch over 65535 exceeds the grid's y dimension")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        params = self.space.complete(params)
        if (why := self.space_refusal(params)) is not None:
            return why
        if (params.get("SPLIT_K", 1) > 1 or params.get("SWAP_AB")) and problem.batched:
            return "split-K and swap-AB are for 2-D GEMMs"
        if params.get("SPLIT_K", 1) > 1 and problem.store_acc:
            return "split-K applies the epilogue in its reduce kernel, which does not store the product"
        if params.get("SPLIT_K", 1) > 1 and problem.K < params["SPLIT_K"] * params["BLOCK_K"]:
            return f"K={problem.K} is too short to split {params['SPLIT_K']} ways of BLOCK_K={params['BLOCK_K']}"
        if (why := pdl_refusal(params, target)) is not None:
            return why
        if target.interpreted:
            return None  # the interpreter has no shared memory or register limits
        if problem.dtype in FP8 and params["BLOCK_K"] < 32:
            return "fp8 MMA needs BLOCK_K >= 32"
        smem = smem_bytes(problem, params)
        if smem > target.smem_per_block:
            return f"needs {smem} B shared memory, {target.name} has {target.smem_per_block}"
        threads = params["num_warps"] * target.warp_size
        acc_regs = params["BLOCK_M"] * params["BLOCK_N"] / threads
        if acc_regs > MAX_ACC_REGS_PER_THREAD:
            return f"accumulator needs {acc_regs:.0f} registers per thread (> {MAX_ACC_REGS_PER_THREAD})"
        if params["BLOCK_M"] * params["BLOCK_N"] < 8 * threads:
            return "tile too small for the number of warps"
        return registers.refusal(self.id, params, target, self.kernel_problem(problem, params).layout_b)

    def register_pressure(self, problem: GemmProblem, params: Params, target: Target) -> float:
        """The cost model's occupancy factor for this tile's registers (templates/triton/registers.py)."""
        return registers.occupancy_factor(self.id, self.space.complete(params), target,
                                          self.kernel_problem(problem, params).layout_b)

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        """Values the jinja source is rendered with (for the problem the kernel computes)."""
        shown = problem.describe()
        problem = self.kernel_problem(problem, params)
        # the interpreter's bf16 (and fp8) arithmetic is wrong: compute those tiles in fp32
        upcast = target.interpreted and problem.dtype not in ("fp32", "fp16")
        fp32_dot = problem.dtype == "fp32" or upcast
        tf32 = problem.dtype == "fp32" and tensor_core_dtype(problem, target)
        stored = (epilogue_expr(problem.epilogue[:problem.acc_after], problem.epilogue_inputs)
                  if problem.store_acc else None)
        epilogue = render_epilogue(problem_epilogue(problem), target.interpreted, stored,
                                   out_dtype=problem.out_dtype, stored_dtype=problem.dtype)
        return dict(
            kernel_name=self.kernel_name, problem_text=shown,
            split_k=params.get("SPLIT_K", 1), swap_ab=bool(params.get("SWAP_AB")),
            params_text=self.space.encode(params), target=target.name,
            out_torch_dtype=TORCH_DTYPE[problem.out_dtype], n_inputs=len(problem.epilogue_inputs),
            epilogue_code=epilogue.code, epilogue_helpers=epilogue.helpers,
            store_acc=problem.store_acc, acc_torch_dtype=TORCH_DTYPE[problem.dtype],
            epilogue_stored=epilogue.stored, epilogue_out_value=epilogue.out_value,
            epilogue_stored_value=epilogue.stored_value,
            index_64=needs_int64(problem),
            even_k="K" not in problem.dynamic and problem.K % params["BLOCK_K"] == 0,
            upcast=upcast,
            dot_kwargs=f', input_precision="{"tf32" if tf32 else "ieee"}"' if fp32_dot else "",
            pdl=bool(params.get("PDL")), gdc_import=GDC_IMPORT,
            **params,
        )

    def unit_strides(self, problem: GemmProblem, params: Params | None = None) -> dict[str, int]:
        """Stride arguments that are 1 for operands laid out as the problem says (the JIT
        specialises those; AOT does the same). ``problem`` is the kernel's problem; under
        swap-AB without split-K the kernel writes C transposed, so its unit stride is along M."""
        params = params or {}
        swapped_store = params.get("SWAP_AB") and params.get("SPLIT_K", 1) == 1
        units = {"stride_cm" if swapped_store else "stride_cn": 1}
        if problem.store_acc:
            units["stride_dm" if swapped_store else "stride_dn"] = 1
        units["stride_ak" if problem.layout_a == "row" else "stride_am"] = 1
        units["stride_bn" if problem.layout_b == "row" else "stride_bk"] = 1
        if problem.layout_a == "strided":
            units.pop("stride_am")
        if problem.layout_b == "strided":
            units.pop("stride_bk")
        return units | epilogue_unit_strides(problem)

    def divisible(self, problem: GemmProblem) -> list[str]:
        """Size and stride arguments that are multiples of 16 at the problem's sizes."""
        dyn = problem.dynamic
        names = divisible_sizes(problem)
        outer = {"stride_am": problem.K if problem.layout_a == "row" else None,
                 "stride_ak": problem.M if problem.layout_a == "col" else None,
                 "stride_bk": problem.N if problem.layout_b == "row" else None,
                 "stride_bn": problem.K if problem.layout_b == "col" else None,
                 "stride_cm": problem.N}
        depends = {"stride_am": "K", "stride_ak": "M", "stride_bk": "N", "stride_bn": "K", "stride_cm": "N"}
        names += [n for n, v in outer.items() if v is not None and depends[n] not in dyn and v % 16 == 0]
        return names

    def aot_spec(self, problem: GemmProblem, params: Params) -> AotSpec:
        problem = self.kernel_problem(problem, params)
        split = params.get("SPLIT_K", 1) > 1
        pointers = {"A": TRITON_POINTER[problem.dtype], "B": TRITON_POINTER[problem.dtype],
                    "C": TRITON_POINTER[problem.out_dtype]}
        if split:  # the main kernel writes the fp32 workspace; the epilogue runs in _reduce
            pointers["C"] = "*fp32"
        else:
            if problem.store_acc:  # the product, stored beside the epilogue's result
                pointers["D"] = TRITON_POINTER[problem.dtype]
            for i, inp in enumerate(problem.epilogue_inputs):
                pointers[f"E{i}"] = TRITON_POINTER[inp.dtype]
        constexprs = {k: params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        constexprs.update(self.unit_strides(problem, params))
        if split:
            constexprs = {k: v for k, v in constexprs.items() if not k.startswith("stride_e")}
        divisible = [d for d in self.divisible(problem) if not (d == "stride_cm" and params.get("SWAP_AB"))]
        return AotSpec(self.kernel_name, "triton", pointers, constexprs,
                       tuple(pointers) + tuple(divisible), compile_options(params),
                       int_type="i64" if needs_int64(problem) and not problem.dynamic else "i32")

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name=self.id.replace(".", "_"), interpret=target.interpreted,
            aot=None if target.interpreted else self.aot_spec(problem, params))

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        return mma_checks(self.kernel_problem(problem, params), params, target) + pdl_checks(params, target)

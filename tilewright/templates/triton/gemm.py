"""Tiled Triton GEMM with GROUP_M swizzle, any strides, a batch dimension and a fused epilogue.

Parameters are the usual Triton GEMM tunables (BLOCK_M/BLOCK_N/BLOCK_K, GROUP_M, num_warps,
num_stages). Masks make every M/N/K legal (1, primes, 0); accumulation is fp32 for every input
dtype. On the ``cpu`` target the kernel runs in the Triton interpreter, whose bf16 arithmetic is
wrong (triton issue 11584), so bf16 tiles are upcast to fp32 there before ``tl.dot``.
"""

from __future__ import annotations

from tilewright.errors import UnsupportedProblemError
from tilewright.problem import ELEMENT_BYTES, GEMM_INPUT_DTYPES, GemmProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, Knob, ParamSpace, Params, RenderedKernel, Support, TemplateSpec, powers_of_two,
)

_TORCH_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_INT32_MAX = 2**31 - 1
# fp32 accumulator registers a thread may hold before the kernel spills (of 255 per thread)
_MAX_ACC_REGS_PER_THREAD = 128


def smem_bytes(problem: GemmProblem, params: Params) -> int:
    """Shared memory the software pipeline holds: num_stages copies of an A and a B tile."""
    tile = params["BLOCK_M"] * params["BLOCK_K"] + params["BLOCK_K"] * params["BLOCK_N"]
    return max(params["num_stages"] - 1, 1) * tile * ELEMENT_BYTES[problem.dtype]


class TritonGemm(TemplateSpec):
    id = "triton.gemm"
    backend = "triton"
    op = "gemm"
    jinja = "gemm.py.jinja"
    space = ParamSpace((
        Knob("BLOCK_M", powers_of_two(16, 256), 64, "rows of C per program"),
        Knob("BLOCK_N", powers_of_two(16, 256), 64, "columns of C per program"),
        Knob("BLOCK_K", powers_of_two(16, 256), 32, "K slice per main-loop step"),
        Knob("GROUP_M", (1, 4, 8, 16), 8, "programs per swizzle group along M"),
        Knob("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
        Knob("num_stages", (1, 2, 3, 4, 5, 6), 3, "software-pipeline depth"),
    ))

    def supports(self, problem: GemmProblem, target: Target) -> Support:
        if target.backend not in ("cuda", "hip", "cpu"):
            return Support(False, f"Triton does not generate for {target.backend}")
        if problem.dtype not in GEMM_INPUT_DTYPES:
            return Support(False, f"input dtype {problem.dtype} (Triton GEMM takes fp32/fp16/bf16)")
        if problem.out_dtype not in ("fp32", "fp16", "bf16"):
            return Support(False, f"output dtype {problem.out_dtype}")
        if problem.batch > 65535:
            return Support(False, "batch over 65535 exceeds the grid's y dimension")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        try:
            self.space.validate(params)
        except ValueError as e:
            return str(e)
        if target.interpreted:
            return None  # the interpreter has no shared memory or register limits
        smem = smem_bytes(problem, params)
        if smem > target.smem_per_block:
            return f"needs {smem} B shared memory, {target.name} has {target.smem_per_block}"
        threads = params["num_warps"] * target.warp_size
        acc_regs = params["BLOCK_M"] * params["BLOCK_N"] / threads
        if acc_regs > _MAX_ACC_REGS_PER_THREAD:
            return f"accumulator needs {acc_regs:.0f} registers per thread (> {_MAX_ACC_REGS_PER_THREAD})"
        if params["BLOCK_M"] * params["BLOCK_N"] < 8 * threads:
            return "tile too small for the number of warps"
        return None

    def render(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        support = self.supports(problem, target)
        if not support:
            raise UnsupportedProblemError(f"{self.id} cannot run {problem.describe()}: {support.reason}")
        why = self.check(params, problem, target)
        if why:
            raise UnsupportedProblemError(f"{self.id} params {dict(params)} on {target.name}: {why}")
        upcast = target.interpreted and problem.dtype == "bf16"
        fp32_dot = problem.dtype == "fp32" or upcast
        tf32 = problem.dtype == "fp32" and _allow_tf32() and not target.interpreted
        dot_kwargs = f', input_precision="{"tf32" if tf32 else "ieee"}"' if fp32_dot else ""
        ops = [{
            "kind": op.kind, "input": op.input, "scale": op.scale, "reverse": op.reverse,
            "scalar_text": repr(float(op.scalar)) if op.scalar is not None else "",
        } for op in problem.epilogue]
        source = self.render_jinja(
            kernel_name="tw_gemm_kernel",
            problem_text=problem.describe(),
            params_text=self.space.encode(params),
            target=target.name,
            out_torch_dtype=_TORCH_DTYPE[problem.out_dtype],
            n_inputs=len(problem.epilogue_inputs),
            inputs=problem.epilogue_inputs,
            epilogue=ops,
            uses_tanh=any(op.kind in ("tanh", "gelu_tanh") for op in problem.epilogue),
            index_64=_needs_int64(problem),
            even_k="K" not in problem.dynamic and problem.K % params["BLOCK_K"] == 0,
            upcast=upcast,
            dot_kwargs=dot_kwargs,
            **params,
        )
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name="triton_gemm", interpret=target.interpreted,
        )


def _allow_tf32() -> bool:
    from tilewright._config import config

    return config.allow_tf32


def _needs_int64(problem: GemmProblem) -> bool:
    if problem.dynamic:
        # a size that varies at run time has no bound here: stay safe
        return True
    biggest = max(problem.M * problem.K, problem.K * problem.N, problem.M * problem.N)
    return problem.batch * biggest > _INT32_MAX

"""What the CuTeDSL GEMM templates share: support rules, the PDL setting, the epilogue context,
shared-memory budgets, the AOT spec and the instruction promises common to all of them.

Every rendered module exposes ``launch(a, b, *epilogue_inputs, out=None, a_scale=None,
b_scale=None)`` (compiles with ``cute.compile`` for the local GPU on first use) and
``compile_aot(arch, dump_dir)`` (compiles for ``arch`` with pointers that are never dereferenced,
dumping PTX and cubin). Rendering needs only jinja; ``supports`` refuses every problem when
``nvidia-cutlass-dsl`` is not installed, so registering these templates never imports it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tilewright._config import config
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import ELEMENT_BYTES, SCALED_FORMATS
from tilewright.runtime.targets import Target
from tilewright.templates.base import (
    SUPPORTED, AotSpec, InstructionCheck, Knob, Params, RenderedKernel, Support, TemplateSpec,
)

CUTE_DTYPE = {"bf16": "cutlass.BFloat16", "fp16": "cutlass.Float16", "fp32": "cutlass.Float32",
              "fp8e4m3": "cutlass.Float8E4M3FN", "fp8e5m2": "cutlass.Float8E5M2"}
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
               "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}
FP8 = ("fp8e4m3", "fp8e5m2")
OUT_DTYPES = ("fp32", "fp16", "bf16")
EPILOGUE_INPUT_DTYPES = ("fp32", "fp16", "bf16")
INT32_MAX = 2**31 - 1
# shared memory a CTA may use on sm_90a/sm_100a (227 KiB), less what barriers and the TMEM
# address slot take
SMEM_BUDGET = 227 * 1024 - 1024

PDL_KNOB = Knob("PDL", (False, True), False,
                "programmatic dependent launch: griddepcontrol.wait before the first dependent "
                "read, launch_dependents after the mainloop, launched with PDL allowed")


def pdl_variants() -> tuple[bool, ...]:
    """PDL settings to propose under ``config.pdl``: 'off' → (False,), 'on' → (True,), 'auto' →
    both, for the autotuner to measure (PDL can speed isolated decode GEMMs and slow a batch)."""
    return {"off": (False,), "on": (True,), "auto": (False, True)}[config.pdl]


def pdl_refusal(params: Params) -> str | None:
    """Why ``params["PDL"]`` is not allowed under the current setting (None when it is)."""
    if params["PDL"] not in pdl_variants():
        return f"TILEWRIGHT_PDL={config.pdl} rules out PDL={params['PDL']}"
    return None


def pdl_checks(params: Params) -> list[InstructionCheck]:
    """PDL kernels must wait on the previous grid and release the next one; others must not."""
    gdc = (r"griddepcontrol\.wait", r"griddepcontrol\.launch_dependents")
    if params["PDL"]:
        return [InstructionCheck("ptx", gdc, (), "programmatic dependent launch (PDL=True)")]
    return [InstructionCheck("ptx", (), gdc, "a kernel without PDL (PDL=False)")]


def tma_check() -> InstructionCheck:
    return InstructionCheck("ptx", (r"cp\.async\.bulk\.tensor",), (), "TMA tile loads")


class CuteDslGemm(TemplateSpec):
    """Base of the CuTeDSL GEMM templates (one per architecture family).

    Subclasses set ``arch`` (the one target they generate for), ``jinja`` and ``space``, and
    implement ``dtype_support``, ``tile_refusal``, ``seed_tiles``, ``mma_checks`` and
    ``extra_context``.
    """

    backend = "cutedsl"
    op = "gemm"
    arch: ClassVar[str]
    host_fn = "gemm_host"

    # -- what can run ------------------------------------------------------------------------
    def dtype_support(self, problem: GemmProblem) -> Support:
        raise NotImplementedError

    def problem_support(self, problem: GemmProblem, target: Target) -> Support:
        """Whether this template renders ``problem`` for ``target`` (the DSL's installation is the language's check)."""
        if problem.store_acc:
            return Support(False, f"{self.id} does not store the product beside its epilogue")
        if problem.epilogue_ir:
            return Support(False, f"{self.id} runs the epilogue kinds only, not an IR epilogue")
        if target.arch != self.arch:
            return Support(False, f"{self.id} generates for {self.arch}, not {target.name}")
        why = self.dtype_support(problem)
        if not why:
            return why
        if problem.out_dtype not in OUT_DTYPES:
            return Support(False, f"output dtype {problem.out_dtype} (takes {', '.join(OUT_DTYPES)})")
        if problem.batched or problem.batch != 1:
            return Support(False, "batched GEMMs are not implemented here (triton.gemm runs them)")
        if "strided" in (problem.layout_a, problem.layout_b):
            return Support(False, "TMA needs one contiguous dim in each operand (layout 'strided')")
        for inp in problem.epilogue_inputs:
            if inp.broadcast not in ("", "M", "N", "MN"):
                return Support(False, f"epilogue input pattern {inp.broadcast!r} (takes '', M, N, MN)")
            if inp.dtype not in EPILOGUE_INPUT_DTYPES:
                return Support(False, f"epilogue input dtype {inp.dtype}")
        if max(problem.M * problem.K, problem.N * problem.K, problem.M * problem.N) > INT32_MAX:
            return Support(False, "an operand has more than 2**31 elements (32-bit offsets here)")
        return self.alignment_support(problem)

    def alignment_support(self, problem: GemmProblem) -> Support:
        """TMA reads rows of 16-byte multiples; the epilogue stores output rows the same way."""
        eb = ELEMENT_BYTES[problem.dtype] if problem.dtype not in SCALED_FORMATS else \
            {"nvfp4": 0.5, "mxfp4": 0.5, "mxfp8": 1}[problem.dtype]
        a_inner = ("K", problem.K) if problem.layout_a == "row" else ("M", problem.M)
        b_inner = ("N", problem.N) if problem.layout_b == "row" else ("K", problem.K)
        for name, (dim, size), bytes_ in (("A", a_inner, eb), ("B", b_inner, eb),
                                          ("the output", ("N", problem.N), ELEMENT_BYTES[problem.out_dtype])):
            if dim not in problem.dynamic and (size * bytes_) % 16:
                return Support(False, f"rows of {name} are {size * bytes_:g} bytes ({dim}={size}); "
                                      "TMA needs 16-byte multiples")
        return SUPPORTED

    def check(self, params: Params, problem: GemmProblem, target: Target) -> str | None:
        try:
            self.space.validate(params)
        except ValueError as e:
            return str(e)
        return pdl_refusal(params) or self.tile_refusal(params, problem)

    def tile_refusal(self, params: Params, problem: GemmProblem) -> str | None:
        raise NotImplementedError

    # -- candidates --------------------------------------------------------------------------
    def seed_tiles(self, problem: GemmProblem) -> list[dict[str, Any]]:
        """Tile settings (every knob but PDL) known to suit this architecture, best first."""
        raise NotImplementedError

    def seed_params(self, problem: GemmProblem, target: Target) -> list[dict[str, Any]]:
        """Candidate parameters for the policy: the seed tiles, each with every PDL setting
        ``config.pdl`` allows (both under 'auto', for the autotuner to measure), illegal ones
        dropped."""
        out = []
        for tile in self.seed_tiles(problem):
            for pdl in pdl_variants():
                params = {**tile, "PDL": pdl}
                if params not in out and self.check(params, problem, target) is None:
                    out.append(params)
        return out

    # -- rendering ---------------------------------------------------------------------------
    def extra_context(self, problem: GemmProblem, params: Params) -> dict[str, Any]:
        return {}

    def context(self, problem: GemmProblem, params: Params, target: Target) -> dict[str, Any]:
        ops = [{"kind": op.kind, "input": op.input, "scale": op.scale, "reverse": op.reverse,
                "scalar_text": repr(float(op.scalar)) if op.scalar is not None else ""}
               for op in problem.epilogue]
        eps = [{"i": i, "pattern": inp.broadcast, "dtype": inp.dtype,
                "cute_dtype": CUTE_DTYPE[inp.dtype], "torch_dtype": TORCH_DTYPE[inp.dtype],
                "align": int(16 // ELEMENT_BYTES[inp.dtype]), "esize": int(ELEMENT_BYTES[inp.dtype])}
               for i, inp in enumerate(problem.epilogue_inputs)]
        return dict(
            problem_text=problem.describe(), params_text=self.space.encode(params),
            target=target.name, arch=self.arch, ops=ops, eps=eps,
            out_cute=CUTE_DTYPE[problem.out_dtype], out_torch=TORCH_DTYPE[problem.out_dtype],
            out_align=int(16 // ELEMENT_BYTES[problem.out_dtype]),
            a_k_major=problem.layout_a == "row", b_k_major=problem.layout_b == "col",
            **self.extra_context(problem, params), **params,
        )

    def render_kernel(self, problem: GemmProblem, params: Params, target: Target) -> RenderedKernel:
        source = self.render_jinja(**self.context(problem, params, target))
        return RenderedKernel(
            template_id=self.id, params=dict(params), target=target.name, source=source,
            name=self.id.replace(".", "_"), aot=AotSpec(self.host_fn, "cutedsl", {}, {}, (),
                                                        {"gpu_arch": self.arch}))

    # -- promises ----------------------------------------------------------------------------
    def mma_checks(self, problem: GemmProblem, params: Params) -> list[InstructionCheck]:
        raise NotImplementedError

    def expected_instructions(self, problem: GemmProblem, params: Params,
                              target: Target) -> list[InstructionCheck]:
        if target.arch != self.arch:
            return []
        return self.mma_checks(problem, params) + [tma_check()] + pdl_checks(params)


def useful_stages(problem: GemmProblem, block_k: int, stages: int) -> int:
    """No more pipeline stages than the K loop has tiles (at least 2): a deeper ring only takes
    shared memory. A dynamic K keeps ``stages``."""
    if "K" in problem.dynamic:
        return stages
    return max(2, min(stages, -(-problem.K // block_k)))


def smem_bytes(tile_m: int, tile_n: int, tile_k: int, stages: int, element_bytes: float) -> int:
    """Shared memory of a TMA pipeline: ``stages`` copies of an A (tile_m x tile_k) and a B
    (tile_n x tile_k) tile."""
    return int(stages * (tile_m + tile_n) * tile_k * element_bytes)

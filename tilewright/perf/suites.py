"""Named benchmark suites: lists of GEMM problems, mostly from ``bench/cases/llm_gemm_shapes.json``.

| suite | problems |
| --- | --- |
| ``tiny`` | four small fp32 GEMMs that run in seconds on a CPU (tests, dry runs) |
| ``llm-decode`` | Llama-3-8B and Qwen3-30B-A3B (MoE) layers, bf16, every decode M of the file |
| ``llm-prefill`` | the same layers, bf16, every prefill M |
| ``llm`` | both |
| ``sycl-cpu`` | five fp32 GEMMs (decode-thin to 256³) for the ``xpu:opencl-cpu`` target: SYCL kernels on the OpenCL CPU device vs ATen on the same CPU |
| ``h200-check`` | the same layers at M = 16, 2048, 1, 64, 8192 (decode and prefill), every layer at M = 16 first, then at 2048, ...: what ``bench/device_check.sh`` times within its budget |
| ``nvfp4-decode`` | the dense Llama-3-8B and Qwen3-30B-A3B layers as NVFP4 x NVFP4 GEMMs (W4A4, alpha fused, bf16 out: what ``NVFP4Linear`` lowers to) at M = 1, 2, 4, 8, 16, 32, 64 |
| ``nvfp4-check`` | the same at M = 1, 16, 64 without the lm_head, and after Llama-3-8B's rows its layers at M = 16 as MXFP8 GEMMs (what ``F.scaled_mm`` with ``BlockWise1x32`` lowers to): ``bench/device_check.sh``'s block-scaled rows |
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from tilewright.autotune.shapes import NamedProblem
from tilewright.errors import TilewrightError
from tilewright.kinds.gemm.shapes import load_shapes, problems_from_shapes
from tilewright.kinds.gemm.problem import GemmProblem
from tilewright.problem import EpilogueInput, EpilogueOp

LLM_MODELS = ("llama-3-8b", "qwen3-30b-a3b")


class UnknownSuiteError(TilewrightError):
    """A suite name that is not defined; the message lists the suites."""


def default_shapes_path() -> Path:
    """``bench/cases/llm_gemm_shapes.json`` of the source tree tilewright runs from."""
    return Path(__file__).resolve().parents[2] / "bench" / "cases" / "llm_gemm_shapes.json"


def _tiny(_: Path) -> list[NamedProblem]:
    shapes = [(32, 64, 48, "col"), (64, 32, 64, "row"), (16, 128, 32, "col"), (48, 48, 96, "col")]
    return [NamedProblem(f"tiny.{m}x{n}x{k}.{lb}",
                         GemmProblem(M=m, N=n, K=k, dtype="fp32", layout_b=lb))
            for m, n, k, lb in shapes]


def _sycl_cpu(_: Path) -> list[NamedProblem]:
    # the demo Llama's projection shapes at 8 and 64 tokens, and squares up to where one SYCL
    # candidate still runs in tens of milliseconds on the OpenCL CPU device
    shapes = [(8, 128, 128), (64, 256, 128), (64, 128, 256), (128, 128, 128), (256, 256, 256)]
    return [NamedProblem(f"sycl-cpu.{m}x{n}x{k}", GemmProblem(M=m, N=n, K=k, dtype="fp32"))
            for m, n, k in shapes]


def _llm(phases: tuple[str, ...], m_values: list[int] | None = None,
         by_value: bool = False) -> Callable[[Path], list[NamedProblem]]:
    """``by_value``: the problems in the order of ``m_values`` first (every layer at the first M,
    then every layer at the next, ...), not layer by layer: a run stopped by its time budget has
    then timed each layer at the Ms that matter most rather than a few layers at every M."""
    def make(path: Path) -> list[NamedProblem]:
        problems = problems_from_shapes(load_shapes(path), models=LLM_MODELS, phases=phases,
                                        m_values=m_values, dtype="bf16")
        if by_value and m_values:
            rank = {m: i for i, m in enumerate(m_values)}
            problems = sorted(problems, key=lambda n: rank.get(n.problem.M, len(rank)))  # stable
        return problems
    return make


def nvfp4_problem(p: GemmProblem) -> GemmProblem:
    """A bf16 linear's GEMM as its NVFP4 twin: packed operands with row-major E4M3 block scales,
    the two global scales as scalar multiplies (alpha), bf16 out: ``NVFP4Linear``'s lowering."""
    return dataclasses.replace(p, dtype="nvfp4", out_dtype="bf16", layout_b="col", scale_layout="row",
                               op="nvfp4_mm", epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                               epilogue_inputs=(EpilogueInput("", "fp32"), EpilogueInput("", "fp32")))


def mxfp8_problem(p: GemmProblem) -> GemmProblem:
    """A bf16 linear's GEMM as an MXFP8 one (E4M3 values, row-major E8M0 scales per 32, no
    alpha, bf16 out): what a block-scaled ``F.scaled_mm`` lowers to."""
    return dataclasses.replace(p, dtype="mxfp8", out_dtype="bf16", layout_b="col", scale_layout="row",
                               op="mx_mm", epilogue=(), epilogue_inputs=())


def _nvfp4(m_values: list[int], skip: tuple[str, ...] = (), mx_model: str = "",
           mx_m: int = 16) -> Callable[[Path], list[NamedProblem]]:
    def make(path: Path) -> list[NamedProblem]:
        dense = problems_from_shapes(load_shapes(path), models=LLM_MODELS, phases=("decode",),
                                     m_values=m_values, dtype="bf16")
        dense = [n for n in dense if not n.problem.batched and not any(s in n.name for s in skip)]
        out = [NamedProblem(f"nvfp4.{n.name}", nvfp4_problem(n.problem)) for n in dense]
        if mx_model:  # after that model's NVFP4 rows, so a budget-cut run still times them
            mx = [NamedProblem(f"mxfp8.{n.name}", mxfp8_problem(n.problem)) for n in dense
                  if n.name.startswith(mx_model + ".") and n.problem.M == mx_m]
            last = max((i for i, n in enumerate(dense) if n.name.startswith(mx_model + ".")), default=-1)
            out = out[:last + 1] + mx + out[last + 1:]
        return out
    return make


SUITES: dict[str, Callable[[Path], list[NamedProblem]]] = {
    "tiny": _tiny,
    "sycl-cpu": _sycl_cpu,
    "llm-decode": _llm(("decode",)),
    "llm-prefill": _llm(("prefill",)),
    "llm": _llm(("decode", "prefill")),
    # in order of value: a decode step's M = 16 and a prefill's 2048 first
    "h200-check": _llm(("decode", "prefill"), [16, 2048, 1, 64, 8192], by_value=True),
    "nvfp4-decode": _nvfp4([1, 2, 4, 8, 16, 32, 64]),
    "nvfp4-check": _nvfp4([1, 16, 64], skip=(".lm_head.",), mx_model="llama-3-8b"),
}


SUITE_TARGETS = {"sycl-cpu": "xpu:opencl-cpu"}
"""The target a suite runs on when ``bench run`` is given none (else this machine's GPU or cpu)."""


def suite_problems(name: str, shapes: Path | str | None = None) -> list[NamedProblem]:
    """The problems of suite ``name`` (shapes from ``shapes`` or the in-repo file).

    Raises:
        UnknownSuiteError: no such suite.
        ShapesFileError: the shapes file is missing or malformed.
    """
    if name not in SUITES:
        raise UnknownSuiteError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
    return SUITES[name](Path(shapes) if shapes else default_shapes_path())

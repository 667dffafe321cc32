"""Named benchmark suites: lists of GEMM problems, mostly from ``bench/cases/llm_gemm_shapes.json``.

| suite | problems |
| --- | --- |
| ``tiny`` | four small fp32 GEMMs that run in seconds on a CPU (tests, dry runs) |
| ``llm-decode`` | Llama-3-8B and Qwen3-30B-A3B (MoE) layers, bf16, every decode M of the file |
| ``llm-prefill`` | the same layers, bf16, every prefill M |
| ``llm`` | both |
| ``sycl-cpu`` | five fp32 GEMMs (decode-thin to 256³) for the ``xpu:opencl-cpu`` target: SYCL kernels on the OpenCL CPU device vs ATen on the same CPU |
| ``h200-check`` | the same layers at M = 1, 16, 64 (decode) and 2048, 8192 (prefill): what ``bench/device_check.sh`` times within its budget |
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tilewright.autotune.shapes import NamedProblem, load_shapes, problems_from_shapes
from tilewright.errors import TilewrightError
from tilewright.problem import GemmProblem

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


def _llm(phases: tuple[str, ...], m_values: list[int] | None = None) -> Callable[[Path], list[NamedProblem]]:
    def make(path: Path) -> list[NamedProblem]:
        return problems_from_shapes(load_shapes(path), models=LLM_MODELS, phases=phases,
                                    m_values=m_values, dtype="bf16")
    return make


SUITES: dict[str, Callable[[Path], list[NamedProblem]]] = {
    "tiny": _tiny,
    "sycl-cpu": _sycl_cpu,
    "llm-decode": _llm(("decode",)),
    "llm-prefill": _llm(("prefill",)),
    "llm": _llm(("decode", "prefill")),
    "h200-check": _llm(("decode", "prefill"), [1, 16, 64, 2048, 8192]),
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

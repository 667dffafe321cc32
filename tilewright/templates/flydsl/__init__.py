"""FlyDSL templates (``flydsl``, ROCm/FlyDSL): gfx950 kernels written in FlyDSL's Python DSL,
rendered from jinja and compiled ahead of time, compile-only, in child processes
(:mod:`tilewright.runtime.flydsl`). Registering them needs neither FlyDSL nor a GPU.

Each template module adds its spec to ``TEMPLATES`` below (one import, one entry)."""

from tilewright.runtime import flydsl as fly_runtime
from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.flydsl.gemm import FlyDslGemm
from tilewright.templates.flydsl.grouped_gemm import FlyDslGroupedGemm
from tilewright.templates.flydsl.loops import FlyPointwise, FlyReduction
from tilewright.templates.flydsl.mx_gemm import FlyDslMxGemm
from tilewright.templates.flydsl.topk import TEMPLATE as TOPK

TEMPLATES: tuple = (
    FlyDslGemm(),
    FlyDslGroupedGemm(),
    FlyDslMxGemm(),
    TOPK,
    FlyPointwise(),
    FlyReduction(),
)



def _unavailable() -> str | None:
    return fly_runtime.toolchain_problem()  # looked up per call: tests stand a toolchain in


def _versions() -> dict[str, str]:
    return {"flydsl": fly_runtime.dsl_version()}


LANGUAGE = Language(
    name="flydsl",
    description="FlyDSL kernels (flydsl) for gfx950: MFMA GEMMs with fused epilogues, grouped and "
                "MX block-scaled GEMMs, row kernels; built ahead of time, compile-only",
    target_backends=("hip",),
    forcing="FlyDSL kernels only; they are built ahead of time (tilewright aot) and have no "
            "launcher yet, so a compiled model runs every problem on ATen",
    unavailable=_unavailable,
    versions=_versions,
    aot_compile=fly_runtime.compile_aot_job,
    priority=60,
)
MANIFEST = BackendManifest.of(LANGUAGE, TEMPLATES)

"""FlyDSL templates (``flydsl``, ROCm/FlyDSL): gfx950 kernels written in FlyDSL's Python DSL,
rendered from jinja. Each rendered module's ``launch(...)`` (the contract of its problem kind)
runs the kernel through FlyDSL's JIT on torch's current stream
(:mod:`tilewright.templates.flydsl.launch`); ``tilewright aot`` builds it through the same
``launch``, compile-only, in child processes (:mod:`tilewright.templates.flydsl.runtime`). Registering
them needs neither FlyDSL nor a GPU.

Each template module adds its spec to ``TEMPLATES`` below (one import, one entry)."""

from tilewright.templates.flydsl import runtime as fly_runtime
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
                "MX block-scaled GEMMs, row kernels, top-k; launched through FlyDSL's JIT (compile-only "
                "ahead of time here; not yet run on a gfx950)",
    target_backends=("hip",),
    forcing="FlyDSL kernels only (gfx950, where FlyDSL and its ROCm linker are installed: elsewhere "
            "they are built ahead of time only), problems they do not serve run on ATen",
    unavailable=_unavailable,
    versions=_versions,
    aot_compile=fly_runtime.compile_aot_job,
    priority=60,
)
MANIFEST = BackendManifest.of(LANGUAGE, TEMPLATES)

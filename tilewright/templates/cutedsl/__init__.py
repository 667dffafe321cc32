"""CuTeDSL templates (``nvidia-cutlass-dsl``): warp-specialised TMA GEMMs for sm_90a (wgmma)
and sm_100a (tcgen05, dense and block-scaled), compiled with ``cute.compile`` on the device or
ahead of time for another chip. Registering them needs neither the DSL nor a GPU."""

from tilewright.templates.cutedsl import runtime as dsl_runtime
from tilewright.templates.cutedsl.runtime import compile_cutedsl
from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.cutedsl.blockscaled_sm100 import CuteBlockScaledSm100
from tilewright.templates.cutedsl.gemm_sm90 import CuteGemmSm90
from tilewright.templates.cutedsl.gemm_sm100 import CuteGemmSm100


def _unavailable() -> str | None:
    return None if dsl_runtime.available() else dsl_runtime.NOT_INSTALLED


def _versions() -> dict[str, str]:
    return {"cutlass_dsl": dsl_runtime.dsl_version()}


LANGUAGE = Language(
    name="cutedsl",
    description="CuTeDSL kernels (nvidia-cutlass-dsl): TMA + wgmma/tcgen05, PDL; JIT on the GPU or AOT",
    target_backends=("cuda",),
    forcing="CuTeDSL GEMMs only (sm_90a, sm_100a); other problems on ATen",
    unavailable=_unavailable,
    versions=_versions,
    aot_compile=compile_cutedsl,
    priority=30,
)
MANIFEST = BackendManifest.of(LANGUAGE, (CuteGemmSm90(), CuteGemmSm100(), CuteBlockScaledSm100()))

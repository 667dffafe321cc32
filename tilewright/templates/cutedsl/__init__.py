"""CuTeDSL templates (``nvidia-cutlass-dsl``): warp-specialised TMA GEMMs for sm_90a (wgmma)
and sm_100a (tcgen05, dense and block-scaled), compiled with ``cute.compile`` on the device or
ahead of time for another chip. Registering them needs neither the DSL nor a GPU."""

from tilewright.templates import BackendManifest
from tilewright.templates.cutedsl.blockscaled_sm100 import CuteBlockScaledSm100
from tilewright.templates.cutedsl.gemm_sm90 import CuteGemmSm90
from tilewright.templates.cutedsl.gemm_sm100 import CuteGemmSm100

MANIFEST = BackendManifest(
    name="cutedsl",
    description="CuTeDSL kernels (nvidia-cutlass-dsl): TMA + wgmma/tcgen05, PDL; JIT on the GPU or AOT",
    target_backends=("cuda",),
    templates=(CuteGemmSm90(), CuteGemmSm100(), CuteBlockScaledSm100()),
)

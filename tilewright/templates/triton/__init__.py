"""Triton templates: JIT on CUDA and ROCm GPUs, interpreted on the CPU."""

from tilewright.templates.triton.aot import compile_triton
from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.triton.attention import TritonAttention
from tilewright.templates.triton.attention_bwd import TritonAttentionBackward
from tilewright.templates.triton.attention_decode import TritonAttentionDecode
from tilewright.templates.triton.gemm import TritonGemm
from tilewright.templates.triton.gemm_nvfp4 import TritonGemmNvfp4, TritonGemmNvfp4Mma
from tilewright.templates.triton.gemm_tma import TritonGemmTma
from tilewright.templates.triton.grouped_gemm import TritonGroupedGemm
from tilewright.templates.triton.grouped_gemm_desc import TritonGroupedGemmDesc
from tilewright.templates.triton.grouped_gemm_scaled import TritonGroupedGemmScaled, TritonGroupedGemmScaledMma
from tilewright.templates.triton.loops import TritonPointwise, TritonReduction


def _unavailable() -> str | None:
    import importlib.util

    return None if importlib.util.find_spec("triton") else "triton is not installed (pip install triton)"


LANGUAGE = Language(
    name="triton",
    description="Triton kernels (JIT on cuda/hip, TRITON_INTERPRET on cpu)",
    target_backends=("cuda", "hip", "cpu"),
    forcing="generated Triton kernels only, GEMMs, loop kernels and attention (run by the "
            "Triton interpreter on the cpu target)",
    unavailable=_unavailable,
    aot_compile=compile_triton,
    priority=10,
    pinned_knobs={"hip": {"num_stages": 2}},  # Triton's AMD stream pipeliner wants 2
)
MANIFEST = BackendManifest.of(LANGUAGE, (
    TritonGemm(), TritonGemmTma(), TritonGemmNvfp4(), TritonGemmNvfp4Mma(), TritonPointwise(),
    TritonReduction(), TritonGroupedGemm(), TritonGroupedGemmDesc(), TritonGroupedGemmScaled(),
    TritonGroupedGemmScaledMma(), TritonAttention(), TritonAttentionDecode(),
    TritonAttentionBackward()))

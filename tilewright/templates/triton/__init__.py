"""Triton templates: JIT on CUDA and ROCm GPUs, interpreted on the CPU."""

from tilewright.templates import BackendManifest
from tilewright.templates.triton.gemm import TritonGemm
from tilewright.templates.triton.gemm_nvfp4 import TritonGemmNvfp4, TritonGemmNvfp4Mma
from tilewright.templates.triton.gemm_tma import TritonGemmTma
from tilewright.templates.triton.grouped_gemm import TritonGroupedGemm
from tilewright.templates.triton.grouped_gemm_desc import TritonGroupedGemmDesc
from tilewright.templates.triton.loops import TritonPointwise, TritonReduction

MANIFEST = BackendManifest(
    name="triton",
    description="Triton kernels (JIT on cuda/hip, TRITON_INTERPRET on cpu)",
    target_backends=("cuda", "hip", "cpu"),
    templates=(TritonGemm(), TritonGemmTma(), TritonGemmNvfp4(), TritonGemmNvfp4Mma(),
               TritonPointwise(), TritonReduction(), TritonGroupedGemm(),
               TritonGroupedGemmDesc()),
)

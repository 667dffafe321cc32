"""ATen "templates": the PyTorch operators a GEMM problem falls back to, as one more candidate."""

from tilewright.runtime.languages import Language
from tilewright.templates import BackendManifest
from tilewright.templates.aten.attention import AtenAttention
from tilewright.templates.aten.gemm import AtenGemm
from tilewright.templates.aten.grouped_gemm import AtenGroupedGemm
from tilewright.templates.aten.loops import AtenPointwise, AtenReduction
from tilewright.templates.aten.unfused import UnfusedPointwise, UnfusedReduction

LANGUAGE = Language(
    name="aten",
    description="PyTorch's own operators (cuBLAS/hipBLASLt/oneDNN behind torch.matmul)",
    target_backends=("cuda", "hip", "cpu", "mps", "xpu"),
    forcing="ATen only: GEMMs through PyTorch's matmul, loop kernels as PyTorch operators",
    priority=0,
    calls_aten=True,
)
MANIFEST = BackendManifest.of(LANGUAGE, (AtenGemm(), AtenPointwise(), AtenReduction(), AtenGroupedGemm(),
                                         AtenAttention(), UnfusedPointwise(), UnfusedReduction()))

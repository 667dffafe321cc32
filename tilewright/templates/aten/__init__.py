"""ATen "templates": the PyTorch operators a GEMM problem falls back to, as one more candidate."""

from tilewright.templates import BackendManifest
from tilewright.templates.aten.gemm import AtenGemm
from tilewright.templates.aten.grouped_gemm import AtenGroupedGemm
from tilewright.templates.aten.loops import AtenPointwise, AtenReduction

MANIFEST = BackendManifest(
    name="aten",
    description="PyTorch's own operators (cuBLAS/hipBLASLt/oneDNN behind torch.matmul)",
    target_backends=("cuda", "hip", "cpu", "mps", "xpu"),
    templates=(AtenGemm(), AtenPointwise(), AtenReduction(), AtenGroupedGemm()),
)

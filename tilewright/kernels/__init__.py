"""Public op-level API built on the templates and the autotuner, also as ``torch.library`` ops."""

from tilewright.kernels.gemm import gemm
from tilewright.kernels.grouped import grouped_mm

__all__ = ["gemm", "grouped_mm"]

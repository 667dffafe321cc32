"""Public op-level API built on the templates and the autotuner, also as ``torch.library`` ops."""

from tilewright.kernels.gemm import gemm

__all__ = ["gemm"]

"""Low-precision formats: quantise, dequantise and lay out scales (NVFP4; MXFP4/MXFP8 per OCP
MX v1.0 in :mod:`tilewright.quant.mx`)."""

import torch

from tilewright.quant import mx
from tilewright.quant.nvfp4 import NVFP4Tensor, dequantize, quantize, swizzle_scales

__all__ = ["NVFP4Tensor", "dequantize", "dequantize_block_scaled", "mx", "quantize", "swizzle_scales"]


def dequantize_block_scaled(fmt: str, data: torch.Tensor, scale: torch.Tensor,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``value * block scale`` (rows, K) as ``dtype`` of a stored block-scaled operand with
    row-major scales: nvfp4 (no global scale; that is the GEMM's alpha), mxfp4 or mxfp8.
    Exact in float32 and float64 (what the ATen GEMM template and its reference multiply).

    Raises:
        InvalidInputError: an unknown format or mismatched scales (from :mod:`.mx`).
    """
    if fmt == "nvfp4":
        from tilewright.quant.nvfp4 import dequantize_packed

        return dequantize_packed(data, scale, dtype)
    return mx.dequantize_packed(data, scale, fmt, dtype)

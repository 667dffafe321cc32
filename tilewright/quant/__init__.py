"""Low-precision formats: quantise, dequantise and lay out scales (NVFP4; MXFP4/MXFP8 later)."""

from tilewright.quant.nvfp4 import NVFP4Tensor, dequantize, quantize, swizzle_scales

__all__ = ["NVFP4Tensor", "dequantize", "quantize", "swizzle_scales"]

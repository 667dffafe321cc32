"""``torch.ops.tilewright.nvfp4_quantize``: activation quantisation as a custom op, defined beside
the format it computes. It needs no kernel choice (its eager form is :func:`tilewright.quant.nvfp4.quantize`;
a compiled graph lowers it to a loop kernel, ``kinds/loop/lower/quantize.py``), so it sits in the
base layer, where the compiler can import it; :mod:`tilewright.kernels.nvfp4` re-exports it with
the NVFP4 GEMM.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.quant import nvfp4


@torch.library.custom_op("tilewright::nvfp4_quantize", mutates_args=())
def nvfp4_quantize(x: torch.Tensor, global_scale: Optional[torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``x`` (..., K) along K: (uint8 (..., K/2), float8_e4m3fn (..., K/16), fp32 ())."""
    q = nvfp4.quantize(x, global_scale)
    # a custom op's outputs may not alias its inputs: a calibrated scale comes back as a copy
    return q.data, q.scale, q.global_scale.reshape(()).clone()


@nvfp4_quantize.register_fake
def _(x, global_scale):
    K = x.shape[-1]
    return (x.new_empty((*x.shape[:-1], K // 2), dtype=torch.uint8),
            x.new_empty((*x.shape[:-1], K // nvfp4.BLOCK), dtype=torch.float8_e4m3fn),
            x.new_empty((), dtype=torch.float32))

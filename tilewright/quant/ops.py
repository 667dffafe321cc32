"""``torch.ops.tilewright.nvfp4_quantize`` and ``mx_quantize`` (with ``mx_quantize_bytes``):
activation quantisation as custom ops, defined beside the formats they compute. They need no
kernel choice (their eager forms are :func:`tilewright.quant.nvfp4.quantize` and
:func:`tilewright.quant.mx.quantize`; a compiled graph lowers them to loop kernels,
``kinds/loop/lower/quantize.py`` and ``quantize_mx.py``), so they sit in the base layer, where
the compiler can import them; :mod:`tilewright.kernels.nvfp4` and :mod:`tilewright.kernels.mx`
re-export them with their GEMMs.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilewright.quant import mx, nvfp4


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


@torch.library.custom_op("tilewright::mx_quantize", mutates_args=())
def mx_quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` (..., K) along K to ``fmt``: (data, float8_e8m0fnu scales (..., K/32));
    data is uint8 (..., K/2) for mxfp4, float8_e4m3fn (..., K) for mxfp8."""
    q = mx.quantize(x, fmt)
    return q.data, q.scale


@mx_quantize.register_fake
def _(x, fmt):
    K, vpb = x.shape[-1], mx.values_per_byte(fmt)
    return (x.new_empty((*x.shape[:-1], K // vpb), dtype=torch.uint8 if vpb == 2 else torch.float8_e4m3fn),
            x.new_empty((*x.shape[:-1], K // mx.BLOCK), dtype=torch.float8_e8m0fnu))


@torch.library.custom_op("tilewright::mx_quantize_bytes", mutates_args=())
def mx_quantize_bytes(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mx_quantize` with the E8M0 scales as their uint8 bytes (``e + 127``; 255 NaN).

    What the compiler rewrites ``mx_quantize`` to before lowering
    (``kinds/loop/lower/quantize_mx.py``), followed by a free
    ``view(float8_e8m0fnu)``: the loop kernel that fuses the quantisation into its producer
    stores bytes, a dtype every emitter has, so the kernel IR needs no E8M0 type.
    """
    q = mx.quantize(x, fmt)
    return q.data, q.scale.view(torch.uint8)


@mx_quantize_bytes.register_fake
def _(x, fmt):
    K, vpb = x.shape[-1], mx.values_per_byte(fmt)
    return (x.new_empty((*x.shape[:-1], K // vpb), dtype=torch.uint8 if vpb == 2 else torch.float8_e4m3fn),
            x.new_empty((*x.shape[:-1], K // mx.BLOCK), dtype=torch.uint8))

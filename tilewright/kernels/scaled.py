"""``torch.ops.tilewright.block_scales_rows``: block scales in torch's SWIZZLE_32_4_4 layout as
the row-major (rows, K/block) matrix the block-scaled GEMM templates read.

The lowering of a swizzled ``F.scaled_mm`` (:mod:`tilewright.kinds.gemm.lower_scaled`) puts this op
before the GEMM: one pass over the scales (one byte per 16 or 32 values, 1/16 to 1/32 of the
operand's bytes), run as its ATen ops.
"""

from __future__ import annotations

import torch

from tilewright.quant import scales


@torch.library.custom_op("tilewright::block_scales_rows", mutates_args=())
def block_scales_rows(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) scales (same dtype) from ``scale`` in the SWIZZLE_32_4_4 layout.

    Raises:
        InvalidInputError: an element count that is not ``round_up(rows, 128) * round_up(cols, 4)``.
    """
    return scales.unswizzle(scale, rows, cols)


@block_scales_rows.register_fake
def _(scale, rows, cols):
    return scale.new_empty((rows, cols))

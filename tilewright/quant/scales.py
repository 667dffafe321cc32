"""Block-scale layouts as PyTorch's ``F.scaled_mm`` / ``torch._scaled_mm`` take them.

``SwizzleType.NO_SWIZZLE``: the scales of a (rows, K) operand are (rows, K/block) row-major (any
shape with that many elements, read in row-major order), one per block of ``block`` values along
K. This is what ROCm's hipBLASLt path reads.

``SwizzleType.SWIZZLE_32_4_4``: cuBLAS's "1D block scaling factors layout" (the layout
Blackwell's block-scaled MMA reads), which torch builds with
``torch.testing._internal.common_quantized.to_blocked`` and checks by element count in
``torch/_meta_registrations.py`` (``round_up(rows, 128) * round_up(K/block, 4)``). The scale
matrix is padded to a multiple of 128 rows and 4 columns and cut into 128x4 tiles, stored tile
after tile, tiles in row-major order (``tile = (r // 128) * (padded_cols / 4) + c // 4``);
inside a tile, scale (r, c) is byte ``(r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``: 32 lines
of 16 bytes, line i holding rows i, i+32, i+64, i+96, four scales each. The flat tensor has
``round_up(rows, 128) * round_up(cols, 4)`` elements; torch accepts it in any shape with that
count (1-D from ``to_blocked``, or 2-D). :func:`tilewright.quant.nvfp4.swizzle_scales` writes
this layout; :func:`unswizzle` reads it back.
"""

from __future__ import annotations

import torch

from tilewright.errors import InvalidInputError

TILE_ROWS, TILE_COLS = 128, 4


def _round_up(n, m: int):
    return (n + m - 1) // m * m


def swizzled_numel(rows, cols):
    """Elements of a (rows, cols) scale matrix in the SWIZZLE_32_4_4 layout (padded)."""
    return _round_up(rows, TILE_ROWS) * _round_up(cols, TILE_COLS)


def unswizzle(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) block scales from ``scale`` in the SWIZZLE_32_4_4 layout (module
    docstring), dtype kept (E8M0, E4M3 or their uint8 bytes); the padding is dropped.

    Args:
        scale: the swizzled scales, any shape with :func:`swizzled_numel` elements, contiguous
            (torch requires it); read in flat order.
        rows: rows of the operand (M for A, N for B); cols: scales per row (K / block).

    Raises:
        InvalidInputError: an element count that is not the padded layout's.
    """
    need = swizzled_numel(rows, cols)
    if scale.numel() != need:
        raise InvalidInputError(
            f"SWIZZLE_32_4_4 scales of {rows} rows x {cols} blocks need {need} elements "
            f"(rows padded to 128, blocks to 4), got {scale.numel()} {tuple(scale.shape)}")
    R, C = _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)
    # flat index = ((rt * C/4 + ct) * 32 + r32) * 16 + r4 * 4 + c4 with r = rt*128 + r4*32 + r32
    # and c = ct*4 + c4: undo the nesting, then reorder the axes to (rt, r4, r32, ct, c4)
    tiles = scale.reshape(R // TILE_ROWS, C // TILE_COLS, 32, 4, TILE_COLS)
    full = tiles.permute(0, 3, 2, 1, 4).reshape(R, C)
    return full[:rows, :cols].contiguous()


def rows_of(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) scales from NO_SWIZZLE ``scale`` (any shape with rows * cols
    elements, read in row-major order).

    Raises:
        InvalidInputError: a different element count.
    """
    if scale.numel() != rows * cols:
        raise InvalidInputError(f"NO_SWIZZLE scales of {rows} rows x {cols} blocks need {rows * cols} "
                                f"elements, got {scale.numel()} {tuple(scale.shape)}")
    return scale.reshape(rows, cols)
